"""The GPU check's table (bench/gpu-check.sh): from a run's report, throughput,
MFU against the measured bf16 GEMM rate, step time, peak memory by category
(the tracker's, and the driver's view), the per-block forward and backward
times from the timeline; then the kernel times bench/gpu_kernels measured.

    python3 bench/gpu_table.py REPORT.h5 [KERNEL_TIMES.log]
"""
import statistics
import sys

import h5py


def text(x):
    return x.decode() if isinstance(x, bytes) else str(x)


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    with h5py.File(argv[1], "r") as f:
        attrs = f["/"].attrs
        s = {k: f["summary"][k][()] for k in f["summary"] if isinstance(f["summary"][k], h5py.Dataset)
             and f["summary"][k].shape == ()}
        print(f"report: {argv[1]} ({text(attrs['status'])})")
        print(f"backend: {text(attrs['backend'])} | {text(s['layout'])} | {text(s['strategy'])} | "
              f"{text(s['precision'])} | {s['parameters'] / 1e6:.1f} M parameters")
        rows = [
            ("tokens/s", f"{s['tokens_per_s']:.0f}"),
            ("step time", f"{s['step_time'] * 1e3:.1f} ms (median of {int(s['measured_steps'])} steps)"),
            ("model FLOP/s", f"{s['flops_per_s'] / 1e12:.1f} TFLOP/s"),
            ("peak", f"{s['peak_flops'] / 1e12:.1f} TFLOP/s ({text(s['peak_source'])})"),
            ("MFU", f"{100 * s['mfu']:.1f} %"),
            ("loss", f"{s['initial_loss']:.4f} -> {s['final_loss']:.4f}"),
        ]
        for cat in ("params", "grads", "optimizer", "activations", "workspace", "comm"):
            rows.append((f"peak {cat}", f"{s['peak_bytes_' + cat] / 2**30:.2f} GiB"))
        rows.append(("peak, tracked total", f"{s['peak_bytes_total'] / 2**30:.2f} GiB"))
        for key, label in (("device_arena_bytes", "device arena"), ("device_memory_used", "driver: used"),
                           ("device_memory_total", "driver: total")):
            if key in attrs:
                rows.append((label, f"{int(attrs[key]) / 2**30:.2f} GiB"))
        if "timeline" in f and f["timeline"].shape[0] > 0:
            t = f["timeline"][()]
            steps = f["steps"][()]
            warm = {int(r["step"]) for r in steps if r["warmup"]}
            layers = int(t["layer"].max()) - 1  # 1..L are the blocks
            for name in ("forward", "backward"):
                d = [r["end"] - r["start"] for r in t
                     if text(r["phase"]) == name and 1 <= r["layer"] <= layers and int(r["step"]) not in warm]
                if d:
                    rows.append((f"block {name}", f"{statistics.median(d) * 1e3:.2f} ms (median over blocks)"))
        width = max(len(k) for k, _ in rows)
        for k, v in rows:
            print(f"  {k:<{width}}  {v}")
    if len(argv) > 2:
        with open(argv[2]) as log:
            print(log.read().rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
