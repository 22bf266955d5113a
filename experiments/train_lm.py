"""Train a small byte-level transformer language model with fa_hw.attention and with torch SDPA, from
the same seed and the same batches, and plot both loss curves in one figure (issue 37, item 4).

    python experiments/train_lm.py [--steps 400] [--device cuda] [--out DIR] [--seed 0]
                                   [--no-noise-run] [--tiny]

Corpus: Python's own standard library, the `*.py` files under sysconfig.get_paths()['stdlib']
(site-/dist-packages excluded), sorted by path and concatenated as bytes: a real text on every
machine with Python, offline. Tokens are bytes (vocabulary 256); the last 5% is held out.
Model (the default): 4 pre-LayerNorm blocks, d_model 256, 4 heads of 64, context 256, a 4x GELU
MLP, learned positions, tied embeddings; AdamW (lr 1e-3, 50 warm-up steps, cosine), batch 32,
gradient clipping at 1.0. The model is float32; the attention core alone runs on fp16 q, k, v for
both backends (fa2_fwd.cu / fa2_bwd.cu read fp16) with a fixed loss scale of 1024 (the gradients
reaching the attention are scaled so that they do not underflow fp16; unscaled before the step),
causal. The two runs differ only in the attention function:
    fa_hw   fa_hw.attention(q, k, v, causal=True, check_finite=False)  (dQ by atomics; no NaN check, so no
            wait for the GPU per call, as SDPA)
    sdpa    torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
Initial weights come from torch.manual_seed(seed), the batch offsets from numpy's default_rng(seed),
so both see the same data in the same order. Unless --no-noise-run, a third run (SDPA from seed + 1:
other weights, other batches) shows how far two equally good runs lie apart, the noise against
which the fa_hw / SDPA difference is to be read. Writes train_lm.json (every step's training loss,
the held-out loss every 50 steps, the steps' times, the corpus, versions) and train_lm.png (the
curves) to --out (default $OUT, else experiments/out). --tiny: a 2-layer, d_model 32 model with
context 32 for a smoke run; on the CPU (--device cpu) the attention runs in float64 (fa_hw.attention's
float64 reference path, not the kernels).
Step time, the same for every backend: each training step is timed on the wall clock from the end
of the previous one to its loss read back (float(loss), which waits for the GPU: the step's whole
GPU work, however asynchronously it was enqueued), the held-out evaluations outside it; step_ms is
the median over the steps, step_ms_first the first step alone (cuBLAS's and fa_hw's kernel loading
and any NVRTC compile land there, once per build), seconds the whole run with evaluations.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import sysconfig
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class ModelConfig:
    layers: int = 4
    d_model: int = 256
    heads: int = 4
    context: int = 256
    batch: int = 32
    lr: float = 1e-3
    warmup: int = 50
    vocab: int = 256

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads


TINY = ModelConfig(layers=2, d_model=32, heads=2, context=32, batch=4, warmup=2)
LOSS_SCALE = 1024.0
EVAL_EVERY, EVAL_BATCHES = 50, 8


def load_corpus(root: str | None = None) -> tuple[np.ndarray, dict]:
    """The bytes of every *.py under the standard library (sorted paths), and what they were."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py")
                   if not {"site-packages", "dist-packages"} & set(p.relative_to(root).parts) and p.is_file())
    if not files:
        raise SystemExit(f"no *.py files under {root}")
    data = np.frombuffer(b"".join(p.read_bytes() for p in files), dtype=np.uint8)
    return data, dict(root=str(root), files=len(files), bytes=int(data.size), python=platform.python_version())


def split(data: np.ndarray, cfg: ModelConfig) -> tuple[np.ndarray, np.ndarray]:
    cut = int(data.size * 0.95)
    train, val = data[:cut], data[cut:]
    if val.size <= cfg.context + 1:
        raise SystemExit(f"the corpus ({data.size} bytes) is too small for context {cfg.context}")
    return train, val


def batch(data: np.ndarray, offsets: np.ndarray, context: int):
    """(inputs, targets) int64 [len(offsets), context]."""
    idx = offsets[:, None] + np.arange(context + 1)[None, :]
    chunk = data[idx].astype(np.int64)
    return chunk[:, :-1], chunk[:, 1:]


def make_model(cfg: ModelConfig, attention, attn_dtype):
    """A GPT-style decoder whose attention core is `attention(q, k, v)` on [B, H, N, d] tensors of
    `attn_dtype` (causal inside); everything else float32 (float64 where attn_dtype is float64)."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(cfg.d_model), nn.LayerNorm(cfg.d_model)
            self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
            self.proj = nn.Linear(cfg.d_model, cfg.d_model)
            self.mlp = nn.Sequential(nn.Linear(cfg.d_model, 4 * cfg.d_model), nn.GELU(),
                                     nn.Linear(4 * cfg.d_model, cfg.d_model))

        def forward(self, x):
            b, n, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, n, 3, cfg.heads, cfg.head_dim).permute(2, 0, 3, 1, 4)
            o = attention(q.to(attn_dtype), k.to(attn_dtype), v.to(attn_dtype))  # [B, H, N, d]
            x = x + self.proj(o.to(x.dtype).transpose(1, 2).reshape(b, n, cfg.d_model))
            return x + self.mlp(self.ln2(x))

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
            self.pos = nn.Parameter(torch.zeros(cfg.context, cfg.d_model))
            self.blocks = nn.ModuleList(Block() for _ in range(cfg.layers))
            self.ln = nn.LayerNorm(cfg.d_model)
            nn.init.normal_(self.tok.weight, std=0.02)
            nn.init.normal_(self.pos, std=0.02)

        def forward(self, idx, targets):
            x = self.tok(idx) + self.pos[: idx.shape[1]]
            for blk in self.blocks:
                x = blk(x)
            logits = self.ln(x) @ self.tok.weight.T
            return nn.functional.cross_entropy(logits.reshape(-1, cfg.vocab), targets.reshape(-1))

    return LM()


def attention_fn(backend: str):
    import torch

    if backend == "fa_hw":
        import fa_hw

        return lambda q, k, v: fa_hw.attention(q, k, v, causal=True, check_finite=False)
    if backend == "sdpa":
        return lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    raise ValueError(f"backend must be fa_hw or sdpa, got {backend!r}")


def train(backend: str, cfg: ModelConfig, steps: int, device: str, seed: int, train_data, val_data,
          attn_dtype=None, log=print) -> dict:
    """One run: {'loss': [per step], 'val': [[step, loss], ...], 'seconds', 'step_ms', 'step_ms_first'}
    (module docstring)."""
    import torch

    dtype = torch.float64 if device == "cpu" else torch.float32
    attn_dtype = attn_dtype or (torch.float64 if device == "cpu" else torch.float16)
    torch.manual_seed(seed)
    model = make_model(cfg, attention_fn(backend), attn_dtype).to(device=device, dtype=dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.1, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / cfg.warmup) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))
    rng = np.random.default_rng(seed)
    val_rng = np.random.default_rng(12345)  # the same held-out batches for every run
    val_offsets = [val_rng.integers(0, val_data.size - cfg.context - 1, cfg.batch) for _ in range(EVAL_BATCHES)]
    losses, vals, step_s = [], [], []

    def evaluate():
        model.eval()
        with torch.no_grad():
            tot = 0.0
            for off in val_offsets:
                x, y = (torch.from_numpy(a).to(device) for a in batch(val_data, off, cfg.context))
                tot += float(model(x, y))
        model.train()
        return tot / len(val_offsets)

    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for step in range(steps):
        if step % EVAL_EVERY == 0:
            vals.append([step, evaluate()])
        t_step = time.perf_counter()
        off = rng.integers(0, train_data.size - cfg.context - 1, cfg.batch)
        x, y = (torch.from_numpy(a).to(device) for a in batch(train_data, off, cfg.context))
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        (loss * LOSS_SCALE).backward()
        for p in model.parameters():
            p.grad.div_(LOSS_SCALE)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))  # waits for the step's GPU work
        step_s.append(time.perf_counter() - t_step)
        if not math.isfinite(losses[-1]):
            raise SystemExit(f"{backend}: the loss is {losses[-1]} at step {step}")
        if step % 50 == 0 or step == steps - 1:
            log(f"{backend:6s} seed {seed} step {step:4d} loss {losses[-1]:.4f} ({time.perf_counter() - t0:.1f} s)")
    vals.append([steps, evaluate()])
    sync()
    seconds = time.perf_counter() - t0
    return dict(backend=backend, seed=seed, loss=losses, val=vals, seconds=seconds,
                step_ms=1e3 * float(np.median(step_s)), step_ms_first=1e3 * step_s[0])


SMOOTH = 21


def smooth(x: np.ndarray, width: int = SMOOTH) -> np.ndarray:
    """The centred mean over `width` steps, the window narrowing symmetrically at the ends (so a
    straight line stays itself and the first and last points are the raw values)."""
    x = np.asarray(x, dtype=np.float64)
    i = np.arange(x.size)
    half = np.minimum(np.minimum(i, x.size - 1 - i), width // 2)
    c = np.concatenate([[0.0], np.cumsum(x)])
    return (c[i + half + 1] - c[i - half]) / (2 * half + 1)


def figure(runs: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    style = {"fa_hw": dict(color="tab:red", lw=2.2, ls="-"), "sdpa": dict(color="tab:blue", lw=1.2, ls="--")}
    for r in runs:
        noise = r["seed"] != runs[0]["seed"]
        st = dict(color="tab:gray", lw=1.0, ls=":") if noise else style[r["backend"]]
        label = f"{r['backend']} (seed {r['seed']})" + (": another seed, the noise" if noise else "")
        loss = np.asarray(r["loss"])
        ax.plot(loss, color=st["color"], alpha=0.15, lw=0.6)
        ax.plot(smooth(loss), **st, label=f"{label}, train (centred mean of {SMOOTH} steps)")
        v = np.asarray(r["val"])
        ax.plot(v[:, 0], v[:, 1], "o", color=st["color"], ms=4 if noise else 5, mfc="none" if r["backend"] == "sdpa" else None,
                label=f"{label}, held-out")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats per byte)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def title_of(meta: dict) -> str:
    """The figure's title, in two lines: the corpus and the model, then the GPU and the steps."""
    corpus, cfg = meta["corpus"], meta["config"]
    return (f"byte-level LM on Python {corpus['python']}'s stdlib ({corpus['bytes'] / 1e6:.1f} MB): {cfg['layers']} layers, "
            f"d_model {cfg['d_model']}, {cfg['heads']} heads of {cfg['d_model'] // cfg['heads']}\n"
            f"context {cfg['context']}, batch {cfg['batch']}, {meta['steps']} steps on {meta['gpu']}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--device", default="cuda", help="cuda (fp16 attention: the kernels) or cpu (float64 reference)")
    p.add_argument("--out", default=os.environ.get("OUT") or "experiments/out")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-noise-run", action="store_true", help="skip the SDPA run from seed + 1")
    p.add_argument("--tiny", action="store_true", help="the 2-layer d_model 32 smoke config")
    p.add_argument("--plot", metavar="JSON", help="only draw the figure of a saved train_lm.json (into --out)")
    args = p.parse_args(argv)
    if args.plot:
        meta = json.loads(Path(args.plot).read_text())
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        figure(meta["runs"], out / "train_lm.png", title_of(meta))
        print(f"wrote {out / 'train_lm.png'}")
        return 0
    if args.steps < 1:
        raise SystemExit(f"--steps must be at least 1, got {args.steps}")
    try:
        import torch
    except ImportError:
        raise SystemExit("train_lm.py needs PyTorch: pip install 'flashsim[torch]'") from None
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device (use --device cpu for the float64 smoke run)")
    if args.device != "cpu" and not args.device.startswith("cuda"):
        raise SystemExit(f"--device must be cuda or cpu, got {args.device!r}")
    cfg = TINY if args.tiny else ModelConfig()
    data, corpus = load_corpus()
    train_data, val_data = split(data, cfg)
    print(f"corpus: {corpus['files']} files, {corpus['bytes']:,} bytes of Python {corpus['python']}'s stdlib; "
          f"config {cfg}", flush=True)
    runs = [train(b, cfg, args.steps, args.device, args.seed, train_data, val_data) for b in ("fa_hw", "sdpa")]
    if not args.no_noise_run:
        runs.append(train("sdpa", cfg, args.steps, args.device, args.seed + 1, train_data, val_data))
    fa, sd = np.asarray(runs[0]["loss"]), np.asarray(runs[1]["loss"])
    summary = dict(max_abs_loss_diff=float(np.abs(fa - sd).max()),
                   mean_abs_loss_diff_last100=float(np.abs(fa - sd)[-100:].mean()),
                   final_val={f"{r['backend']}/seed{r['seed']}": r["val"][-1][1] for r in runs},
                   step_ms={f"{r['backend']}/seed{r['seed']}": r["step_ms"] for r in runs})
    if len(runs) > 2:
        noise = np.asarray(runs[2]["loss"])
        summary["mean_abs_loss_diff_last100_other_seed"] = float(np.abs(sd - noise)[-100:].mean())
    gpu = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = dict(config=asdict(cfg), steps=args.steps, device=args.device, gpu=gpu, torch=torch.__version__,
                corpus=corpus, loss_scale=LOSS_SCALE, summary=summary, runs=runs)
    (out / "train_lm.json").write_text(json.dumps(meta, indent=1))
    figure(runs, out / "train_lm.png", title_of(meta))
    print(json.dumps(summary, indent=1))
    print(f"wrote {out / 'train_lm.json'} and {out / 'train_lm.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
