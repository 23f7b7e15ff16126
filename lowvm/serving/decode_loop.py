"""``DecodeLoop``: greedy decoding as serving engines run it, one CUDA graph per step."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from lowvm.kernels.library import overlapped_launches
from lowvm.serving.clock import timed
from lowvm.serving.generation import cache_arg

__all__ = ["DecodeLoop", "chunked_argmax", "ARGMAX_CHUNK"]

ARGMAX_CHUNK = 1024


def chunked_argmax(logits: torch.Tensor, chunk: int = ARGMAX_CHUNK) -> torch.Tensor:
    """``logits.argmax(-1)`` of a ``[batch, vocab]`` tensor in two reductions: the best of
    each ``chunk`` positions, then the best chunk. Same index (the first of equal maxima):
    compiled, one row of a 128256-token vocabulary is otherwise a single-block reduction
    (29 us on an H100, 1 % of an 8B model's int4 decode step)."""
    batch, vocab = logits.shape
    pad = -vocab % chunk
    padded = torch.nn.functional.pad(logits, (0, pad), value=float("-inf"))
    best, where = padded.view(batch, -1, chunk).max(-1)      # [batch, chunks]
    pick = best.argmax(-1, keepdim=True)                     # first chunk with the max
    return (pick * chunk + where.gather(-1, pick)).squeeze(-1)


class DecodeLoop:
    """Greedy decoding of ``ids`` by our own loop: one prefill, then one step per token.

    Why: ``generate`` runs its per-token logic (stopping criteria, logits processors, cache
    and mask bookkeeping) in Python outside the compiled forward, ~2-2.7 ms per token on an
    H100 for an 8B model, which caps any kernel speed-up. Serving engines capture the whole
    decode step instead; this loop does the same. The prefill is one eager forward of the
    prompt into a transformers ``StaticCache`` (length prompt + ``tokens``); a step is the
    forward of one token per sequence + argmax, reading the static ``ids``/``pos`` buffers
    and writing ``next``. The cache keeps its write position in a device tensor that the
    step advances in place, so a replayed step needs no host bookkeeping. ``capture()``
    (CUDA) warms the step up on a side stream and captures it in one ``CUDAGraph``; each
    token is then two device copies into the static inputs, one replay and one copy out.
    Without ``capture()`` (the CPU path, or a diagnostic) the same step runs as plain calls.
    ``compile_mode`` (not None) compiles the step first with ``torch.compile(fullgraph=True,
    dynamic=False)``; the mode must not use inductor's own CUDA graphs, which would nest.
    As ``generate`` with ``min_new_tokens`` does, end-of-sequence ids are never chosen, so a
    run makes exactly the tokens asked for. Tokens stay on the device (no per-token read
    back, no stopping check): the loop measures the decode step, not a streaming server.
    """

    warmup_steps = 3  # side-stream runs before capture (lazy loads, autotuning, compile)

    def __init__(self, model: Any, ids: torch.Tensor, tokens: int,
                 compile_mode: str | None = None, backend: str = "inductor",
                 overlap: bool = False) -> None:
        from transformers import StaticCache

        batch, prompt_len = ids.shape
        device = ids.device
        self.model, self.prompt, self.tokens = model, ids, tokens
        self.cache = StaticCache(config=model.config, max_cache_len=prompt_len + tokens)
        self.cache_arg = cache_arg(model)
        self.prompt_pos = torch.arange(prompt_len, device=device).repeat(batch, 1)
        # step i (1 <= i < tokens) feeds token i-1 at position prompt_len + i - 1
        self.step_pos = (prompt_len + torch.arange(tokens, device=device)).repeat(batch, 1)
        self.ids = torch.zeros(batch, 1, dtype=torch.long, device=device)  # static inputs
        self.pos = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.next = torch.zeros(batch, 1, dtype=torch.long, device=device)  # static output
        self.out = torch.zeros(batch, tokens, dtype=torch.long, device=device)
        eos = model.generation_config.eos_token_id
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        self.banned = torch.tensor(eos, dtype=torch.long, device=device) if eos else None
        self.step_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = self._forward_pick
        if compile_mode is not None:
            self.step_fn = torch.compile(
                self._forward_pick, fullgraph=True, dynamic=False, backend=backend,
                mode=compile_mode if backend == "inductor" else None)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.build_s: float | None = None  # capture(): warm-up (compilation) + capture
        self.overlap = overlap  # capture lowvm's GEMMs as overlapped launches

    def _pick(self, logits: torch.Tensor) -> torch.Tensor:
        """Greedy token of each row of ``logits`` [batch, vocab], as [batch, 1]."""
        if self.banned is not None:
            logits = logits.index_fill(-1, self.banned, float("-inf"))
        return chunked_argmax(logits).unsqueeze(-1)

    def _forward_pick(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        logits = self.model(input_ids=ids, position_ids=pos, **{self.cache_arg: self.cache},
                            use_cache=True).logits
        return self._pick(logits[:, -1])

    def _step(self) -> None:
        """The decode step (what the graph holds): ``ids`` at ``pos`` -> ``next``."""
        self.next.copy_(self.step_fn(self.ids, self.pos))

    def _run_step(self) -> None:
        if self.graph is not None:
            self.graph.replay()
        else:
            self._step()

    def _prefill(self) -> None:
        self.cache.reset()  # zeroes the cache and its write position, in place
        logits = self.model(input_ids=self.prompt, position_ids=self.prompt_pos,
                            **{self.cache_arg: self.cache}, use_cache=True,
                            logits_to_keep=1).logits
        self.out[:, :1].copy_(self._pick(logits[:, -1]))

    def _decode(self, i: int) -> None:
        """Token ``i`` from token ``i - 1``."""
        self.ids.copy_(self.out[:, i - 1:i])
        self.pos.copy_(self.step_pos[:, i - 1:i])
        self._run_step()
        self.out[:, i:i + 1].copy_(self.next)

    @torch.no_grad()
    def capture(self) -> None:
        """Warm the step up on a side stream, then capture it in one CUDA graph.

        Each warm-up run prefills first, so the cache's write position never passes the
        room left for the tokens asked for (an out-of-range write would be a device fault).
        """
        start = time.perf_counter()
        if self.tokens > 1:
            self._prefill()  # the cache is allocated here, on the current stream
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(self.warmup_steps):
                    self._prefill()
                    self._decode(1)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph), overlapped_launches(self.overlap):
                self._step()
            self.graph = graph
        torch.cuda.synchronize()
        self.build_s = time.perf_counter() - start

    @torch.no_grad()
    def __call__(self, tokens: int) -> torch.Tensor:
        """The first ``tokens`` greedy tokens [batch, tokens] (a fresh tensor)."""
        if not 1 <= tokens <= self.tokens:
            raise ValueError(f"tokens must be in [1, {self.tokens}] (the cache's room); "
                             f"got {tokens}")
        self._prefill()
        for i in range(1, tokens):
            self._decode(i)
        return self.out[:, :tokens].clone()

    @torch.no_grad()
    def step_ms(self, count: int, device: str) -> float | None:
        """Milliseconds of one decode step run alone (a graph replay once captured), after a
        prefill; ``count`` is capped by the room left in the cache."""
        count = min(count, self.tokens - 1)
        if count < 1:
            return None
        self._prefill()
        self._run_step()  # one untimed step
        self._prefill()
        seconds, _ = timed(lambda: [self._run_step() for _ in range(count)], device)
        return 1e3 * seconds / count

    def close(self) -> None:
        """Free the graph's memory pool and drop the compiled step and the cache."""
        if self.graph is not None:
            self.graph.reset()
        self.graph = None
        self.step_fn = self._forward_pick
        self.cache = None
