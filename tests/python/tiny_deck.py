"""The tiny GPT deck the Python tests write their reports with: 4 steps (1
of warm-up) of 4 blocks of width 16, a global batch of 4 in micro-batches of
1, one thread, and a stated peak so that no test measures one."""

DECK = """[run]
steps = 4
warmup_steps = 1
seed = 5
[model]
layers = 4
d_model = 16
heads = 2
vocab = 64
seq_len = 16
[data]
global_batch = 4
micro_batch = 1
[backend]
threads = 1
peak_tflops = 0.05
"""
