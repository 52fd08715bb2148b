// Elements at an address, stored in one of the run's formats: what the
// kernels read and write activations and parameters through, so that one
// model runs at any precision. Under fp32 a tensor holds floats; under bf16
// or fp16 it holds 2-byte elements, and every kernel computes in fp32 inside
// (it widens what it reads and rounds what it writes, once). A Ptr is a
// pointer and its format: offsets count elements, and a kernel refuses
// tensors whose formats do not go together.
//
// A float* converts to a Ptr of fp32 implicitly, so that fp32-only call
// sites (gradients, statistics, the optimizer) read as they always did.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernels/foundation/precision.hpp"

namespace strata::core {

// The 2-byte storage formats as element types (the kernels' templates are
// instantiated for float, Bf16 and Fp16), and their conversions to and from
// fp32: round to nearest, ties to even, as precision.hpp defines them.
struct Bf16 {
  std::uint16_t bits;
};
struct Fp16 {
  std::uint16_t bits;
};

STRATA_HOST_DEVICE inline float to_float(float x) { return x; }
STRATA_HOST_DEVICE inline float to_float(Bf16 x) { return bf16_to_float(x.bits); }
STRATA_HOST_DEVICE inline float to_float(Fp16 x) { return fp16_to_float(x.bits); }

template <typename T>
STRATA_HOST_DEVICE inline T from_float(float x) {
  if constexpr (std::is_same_v<T, Bf16>)
    return Bf16{float_to_bf16(x)};
  else if constexpr (std::is_same_v<T, Fp16>)
    return Fp16{float_to_fp16(x)};
  else
    return x;
}

template <typename T>
inline constexpr Precision precision_of = std::is_same_v<T, Bf16>   ? Precision::bf16
                                          : std::is_same_v<T, Fp16> ? Precision::fp16
                                                                    : Precision::fp32;

template <typename T>
inline constexpr bool is_element = std::is_same_v<T, float> || std::is_same_v<T, Bf16> || std::is_same_v<T, Fp16>;

[[noreturn]] void format_mismatch(Precision have, Precision want);

template <bool Const>
class BasicPtr {
 public:
  using Void = std::conditional_t<Const, const void, void>;
  using Float = std::conditional_t<Const, const float, float>;

  BasicPtr() = default;
  BasicPtr(std::nullptr_t) {}
  BasicPtr(Void* p, Precision dt) : p_(p), dt_(dt) {}
  // From a typed pointer: float*, Bf16*, Fp16* (const ones for a CPtr).
  template <typename X, typename = std::enable_if_t<is_element<std::remove_const_t<X>> && (Const || !std::is_const_v<X>)>>
  BasicPtr(X* p) : p_(p), dt_(precision_of<std::remove_const_t<X>>) {}
  // A read-only view of a writable tensor.
  template <bool C = Const, typename = std::enable_if_t<C>>
  BasicPtr(const BasicPtr<false>& o) : p_(o.get()), dt_(o.precision()) {}

  Void* get() const { return p_; }
  Precision precision() const { return dt_; }
  int element_bytes() const { return core::element_bytes(dt_); }
  explicit operator bool() const { return p_ != nullptr; }
  bool operator==(const BasicPtr& o) const { return p_ == o.p_; }

  // Element i on.
  BasicPtr operator+(std::int64_t i) const {
    if (p_ == nullptr) return {};
    using Byte = std::conditional_t<Const, const std::byte, std::byte>;
    return {static_cast<Byte*>(p_) + i * element_bytes(), dt_};
  }
  // The elements as T (float, Bf16, Fp16): their format must be T's.
  template <typename T>
  std::conditional_t<Const, const T, T>* as() const {
    if (p_ != nullptr && dt_ != precision_of<T>) format_mismatch(dt_, precision_of<T>);
    return static_cast<std::conditional_t<Const, const T, T>*>(p_);
  }
  // fp32 elements as floats.
  Float* f32() const { return as<float>(); }

 private:
  Void* p_ = nullptr;
  Precision dt_ = Precision::fp32;
};

using Ptr = BasicPtr<false>;
using CPtr = BasicPtr<true>;

// f(T{}) with T the element type of format p: how a kernel runs its
// template for the format it is handed.
template <class F>
decltype(auto) with_format(Precision p, F&& f) {
  switch (p) {
    case Precision::bf16: return f(Bf16{});
    case Precision::fp16: return f(Fp16{});
    default: return f(float{});
  }
}

// f(Y{}, X{}) for the element types of two formats (an operation between
// tensors of any two).
template <class F>
void with_formats(Precision y, Precision x, F&& f) {
  with_format(y, [&](auto yt) { with_format(x, [&](auto xt) { f(yt, xt); }); });
}

// f(A{}) for an accumulator of elements of type E that may be E itself or
// fp32 (format p).
template <typename E, class F>
void with_accumulator(Precision p, F&& f) {
  if (p == Precision::fp32)
    f(float{});
  else
    f(E{});
}

}  // namespace strata::core

// Runs `call` with E the element type of `ptr`'s format (float, Bf16, Fp16):
//   STRATA_BY_FORMAT(out, bias_add<E>(out.as<E>(), bias.as<E>(), N, C));
#define STRATA_BY_FORMAT(ptr, call) \
  ::strata::core::with_format((ptr).precision(), [&](auto format_tag_) { \
    using E = decltype(format_tag_);                                   \
    call;                                                              \
  })
