"""Peak memory of loading a dense checkpoint: plain, and quantized while loading.

``python -m lowvm.bench.load_memory --size-gb 1.2 --device cpu,cuda --json out.json``
writes a random Llama-architecture float16 checkpoint of about ``--size-gb`` (one tensor
at a time, so writing it never holds the model), then loads it in a fresh process per
case — ``from_pretrained(path)`` and ``from_pretrained(path,
quantization_config=LowvmConfig(dtype="int4"))`` — and reports each load's peak:

* CPU: the peak of the process's anonymous resident memory (``RssAnon``, sampled every
  2 ms: what the load allocated; pages of the memory-mapped checkpoint are page cache the
  kernel can drop), the peak of all resident memory (``VmHWM``, mapped file pages
  included) during the load and after reading every tensor once (a dense load maps the
  file and reads nothing until used), and both before loading (interpreter, torch,
  transformers and a warm-up load of a tiny checkpoint);
* GPU (``device_map="cuda"``): ``torch.cuda.max_memory_allocated``.

Beside each figure: the loaded model's own bytes and the largest dense layer's, so that
the goal "peak ≤ quantized model + 2 × the largest dense layer" reads off the table.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["write_dense_checkpoint", "measure_load", "main"]

_SHAPES = {  # hidden, intermediate, layers, vocab -> about 1.3 GB at float16
    "1gb": (2048, 5632, 10, 32000),
    "tiny": (256, 512, 2, 512),
}


def write_dense_checkpoint(path: Path, size: str = "1gb", seed: int = 0) -> dict[str, Any]:
    """A random float16 Llama at ``path`` (config.json + one safetensors file per layer
    and an index), written tensor by tensor; returns its sizes."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    hidden, inter, layers, vocab = _SHAPES[size]
    config = LlamaConfig(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                         num_attention_heads=hidden // 128, num_key_value_heads=hidden // 128,
                         vocab_size=vocab, max_position_embeddings=256,
                         tie_word_embeddings=False, dtype="float16")
    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in LlamaForCausalLM(config).state_dict().items()}
    path.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(path)
    gen = torch.Generator().manual_seed(seed)
    groups: dict[str, list[str]] = {}
    for key in shapes:
        part = key.split(".")[2] if key.startswith("model.layers.") else "rest"
        groups.setdefault(part, []).append(key)
    weight_map, total, largest = {}, 0, 0
    for i, keys in enumerate(groups.values()):
        file = f"model-{i:05d}.safetensors"
        tensors = {}
        for key in keys:
            shape = shapes[key]
            t = (torch.randn(shape, generator=gen) * 0.02).half() if len(shape) == 2 \
                else torch.ones(shape, dtype=torch.float16)
            tensors[key] = t
            total += t.numel() * 2
            if key.endswith("proj.weight"):
                largest = max(largest, t.numel() * 2)
        save_file(tensors, str(path / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(keys, file))
        del tensors
    (path / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}))
    return {"bytes": total, "largest_linear_bytes": largest,
            "largest_dense_bytes": max(shapes["model.embed_tokens.weight"][0] * hidden * 2,
                                       largest),
            "shape": {"hidden": hidden, "intermediate": inter, "layers": layers,
                      "vocab": vocab}}


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


class _AnonPeak:
    """Samples RssAnon on a thread (the kernel keeps no high-water mark for it)."""

    def __init__(self) -> None:
        self.peak = _status_kib("RssAnon")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _status_kib("RssAnon"))
            time.sleep(0.002)

    def __enter__(self) -> _AnonPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _status_kib("RssAnon"))


def measure_load(path: str, warmup: str, quantize: bool, device: str) -> dict[str, Any]:
    """One load in this process (run it in a fresh one): its peaks and the model's bytes.
    The same load of the tiny ``warmup`` checkpoint runs first, so that code loaded on
    first use (modeling modules, kernels) is not counted as the load's memory."""
    import torch
    from transformers import AutoModelForCausalLM

    from lowvm.nn.hf.quantizer import LowvmConfig  # registers the "lowvm" method

    kwargs: dict[str, Any] = {"dtype": torch.float16}
    if quantize:
        kwargs["quantization_config"] = LowvmConfig(dtype="int4", group_size=128)
    if device == "cuda":
        kwargs["device_map"] = "cuda"
    AutoModelForCausalLM.from_pretrained(warmup, **kwargs)  # dropped at once
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    before_anon, before_hwm = _status_kib("RssAnon"), _status_kib("VmHWM")
    started = time.perf_counter()
    with _AnonPeak() as anon:
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    seconds = time.perf_counter() - started
    model_bytes = sum(t.numel() * t.element_size()
                      for t in [*model.parameters(), *model.buffers()])
    out = {"case": "int4 on load" if quantize else "dense", "device": device,
           "seconds": round(seconds, 2), "model_bytes": model_bytes,
           "cpu_anon_before_bytes": before_anon * 1024, "cpu_anon_peak_bytes": anon.peak * 1024,
           "cpu_hwm_before_bytes": before_hwm * 1024,
           "cpu_hwm_peak_bytes": _status_kib("VmHWM") * 1024}
    if device == "cuda":
        out["gpu_peak_bytes"] = torch.cuda.max_memory_allocated()
        out["gpu_model_bytes"] = torch.cuda.memory_allocated()
    with torch.no_grad():  # read every tensor once: mapped pages become resident
        for t in [*model.parameters(), *model.buffers()]:
            t.float().sum() if t.is_floating_point() else t.sum()
    out["cpu_hwm_used_bytes"] = _status_kib("VmHWM") * 1024
    return out


def _row(case: dict[str, Any], sizes: dict[str, Any]) -> dict[str, Any]:
    """One table row: the load's peak against the goal."""
    mib = 2**20
    goal = case["model_bytes"] + 2 * sizes["largest_dense_bytes"]
    if case["device"] == "cuda":
        peak = case["gpu_peak_bytes"]
    else:
        peak = case["cpu_anon_peak_bytes"] - case["cpu_anon_before_bytes"]
    return {**case, "peak_bytes": peak, "goal_bytes": goal, "within_goal": peak <= goal,
            "peak_mib": round(peak / mib, 1), "model_mib": round(case["model_bytes"] / mib, 1),
            "goal_mib": round(goal / mib, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lowvm.bench.load_memory",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(_SHAPES), default="1gb")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cpu,cuda")
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--measure", nargs=4, metavar=("PATH", "WARMUP", "QUANTIZE", "DEVICE"),
                        help=argparse.SUPPRESS)  # the child process of one case
    args = parser.parse_args(argv)
    if args.measure:
        path, warmup, quantize, device = args.measure
        print(json.dumps(measure_load(path, warmup, quantize == "1", device)))
        return 0
    rows = []
    with tempfile.TemporaryDirectory(prefix="lowvm-load-memory-") as tmp:
        print(f"writing a random {args.size} float16 checkpoint ...", file=sys.stderr)
        sizes = write_dense_checkpoint(Path(tmp) / "dense", args.size)
        write_dense_checkpoint(Path(tmp) / "warmup", "tiny")
        for device in args.device.split(","):
            for quantize in ("0", "1"):
                done = subprocess.run([sys.executable, "-m", "lowvm.bench.load_memory",
                                       "--measure", str(Path(tmp) / "dense"),
                                       str(Path(tmp) / "warmup"), quantize, device],
                                      capture_output=True, text=True)
                if done.returncode != 0:
                    sys.stderr.write(done.stderr[-4000:])
                    rows.append({"device": device, "case": "int4 on load" if quantize == "1"
                                 else "dense", "error": done.stderr.strip()[-500:]})
                    continue
                rows.append(_row(json.loads(done.stdout.strip().splitlines()[-1]), sizes))
    ok = all("error" not in r for r in rows)
    doc = {"ok": ok, "checkpoint": sizes, "rows": rows}
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2))
    print(f"checkpoint {sizes['bytes'] / 2**20:.0f} MiB, largest dense layer "
          f"{sizes['largest_dense_bytes'] / 2**20:.0f} MiB")
    print(f"{'device':6} {'case':13} {'peak MiB':>9} {'model MiB':>9} {'goal MiB':>9}  ok")
    for r in rows:
        if "error" in r:
            print(f"{r['device']:6} {r['case']:13} error: {r['error'][-120:]}")
        else:
            print(f"{r['device']:6} {r['case']:13} {r['peak_mib']:9.1f} {r['model_mib']:9.1f} "
                  f"{r['goal_mib']:9.1f}  {r['within_goal']}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
