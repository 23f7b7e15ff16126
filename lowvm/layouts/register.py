"""Register layouts: which thread of a block holds which element of a tile.

A register tile of shape ``S`` is spread over ``num_threads`` threads, each holding
``local_size`` elements. The layout is the map ``(thread, local) -> logical index``.

Representation (small and lawful, in the spirit of CuTe): every dimension ``d`` of the
tile is split into *modes*, sizes listed most significant first, whose product is
``shape[d]``. Each mode is driven either by a digit of the thread index
(``spatial_modes``) or by a digit of the local index (``local_modes``); both indices are
read row-major over their list (first entry most significant). A spatial entry ``-k``
is a *replication* digit of size ``k``: threads that differ only in it hold the same
elements (what a reduction leaves behind).

Everything else is built from four primitives and these combinators:

* ``local(2, 4)``: one thread holds a 2x4 tile, row-major;
* ``spatial(8, 4)``: 32 threads, one element each, thread ``t`` at ``(t // 4, t % 4)``;
* ``column_local`` / ``column_spatial``: the same with column-major numbering;
* ``a * b`` (or chained, ``local(2, 1).spatial(8, 4).local(1, 2)``): replace every
  element of ``a`` by a tile laid out as ``b``; ``a``'s thread and local digits are the
  more significant ones;
* ``reduce(layout, dims)``: the layout of the tile reduced over ``dims``, the threads
  that held the reduced elements now holding replicas;
* ``concat(a, b)``: a layout of rank ``rank(a) + rank(b)``, ``a``'s dims first;
* ``split_pairs(a, span)``: ``a``'s elements per thread, locals reordered so that each run
  of ``span`` lists ``a``'s even locals, then its odd ones (how packed codes are stored so
  that one 32-bit word yields register pairs without byte shuffles).

Two layouts are equal when they map every ``(thread, local)`` to the same index.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from lowvm.errors import LayoutError

__all__ = [
    "RegisterLayout",
    "local",
    "spatial",
    "column_local",
    "column_spatial",
    "compose",
    "reduce",
    "concat",
    "permute",
    "split_pairs",
    "local_permutation",
]


def _check_shape(shape: Sequence[int], what: str) -> tuple[int, ...]:
    if len(shape) == 0:
        raise LayoutError(f"{what}: shape must have at least one dimension, got ()")
    out = []
    for s in shape:
        if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or int(s) < 1:
            raise LayoutError(
                f"{what}: every size must be a positive integer, got {s!r} in shape "
                f"{tuple(shape)!r}"
            )
        out.append(int(s))
    return tuple(out)


@dataclass(frozen=True, eq=False)
class RegisterLayout:
    """The map ``(thread, local) -> logical index`` of a register tile (see module doc).

    Build layouts with :func:`local`, :func:`spatial`, ``*`` and friends rather than by
    hand; the constructor checks the representation and drops size-1 modes.
    """

    shape: tuple[int, ...]
    mode_shape: tuple[tuple[int, ...], ...]
    spatial_modes: tuple[int, ...]
    local_modes: tuple[int, ...]
    recipe: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        shape = _check_shape(self.shape, "RegisterLayout")
        if len(self.mode_shape) != len(shape):
            raise LayoutError(
                f"RegisterLayout: mode_shape has {len(self.mode_shape)} dims, shape has "
                f"{len(shape)}"
            )
        sizes: list[int] = []
        for d, modes in enumerate(self.mode_shape):
            if math.prod(modes) != shape[d]:
                raise LayoutError(
                    f"RegisterLayout: modes {modes} of dim {d} multiply to "
                    f"{math.prod(modes)}, not {shape[d]}"
                )
            sizes.extend(modes)
        used = [m for m in self.spatial_modes if m >= 0] + list(self.local_modes)
        if sorted(used) != list(range(len(sizes))):
            raise LayoutError(
                "RegisterLayout: every mode must be driven exactly once by the thread or "
                f"local index; modes {list(range(len(sizes)))}, spatial "
                f"{self.spatial_modes}, local {self.local_modes}"
            )
        # canonical form: no size-1 modes, no size-1 replication digits
        if any(s == 1 for s in sizes) or any(m == -1 for m in self.spatial_modes):
            keep = [i for i, s in enumerate(sizes) if s != 1]
            renumber = {old: new for new, old in enumerate(keep)}
            mode_shape = tuple(tuple(s for s in modes if s != 1) for modes in self.mode_shape)
            spatial_modes = tuple(
                (renumber[m] if m >= 0 else m)
                for m in self.spatial_modes
                if (m < -1) or (m >= 0 and sizes[m] != 1)
            )
            local_modes = tuple(renumber[m] for m in self.local_modes if sizes[m] != 1)
            object.__setattr__(self, "mode_shape", mode_shape)
            object.__setattr__(self, "spatial_modes", spatial_modes)
            object.__setattr__(self, "local_modes", local_modes)
        object.__setattr__(self, "shape", shape)

    # basic facts ------------------------------------------------------------------
    @cached_property
    def mode_sizes(self) -> tuple[int, ...]:
        """Sizes of all modes, dims in order, most significant first within a dim."""
        return tuple(s for modes in self.mode_shape for s in modes)

    @cached_property
    def mode_dims(self) -> tuple[int, ...]:
        """The dimension each mode belongs to."""
        return tuple(d for d, modes in enumerate(self.mode_shape) for _ in modes)

    @cached_property
    def mode_strides(self) -> tuple[int, ...]:
        """How far one step of each mode moves along its dimension."""
        strides: list[int] = []
        for modes in self.mode_shape:
            acc = []
            stride = 1
            for s in reversed(modes):
                acc.append(stride)
                stride *= s
            strides.extend(reversed(acc))
        return tuple(strides)

    @property
    def rank(self) -> int:
        """Number of dimensions of the tile."""
        return len(self.shape)

    @cached_property
    def spatial_sizes(self) -> tuple[int, ...]:
        """Size of each digit of the thread index."""
        return tuple(self.mode_sizes[m] if m >= 0 else -m for m in self.spatial_modes)

    @cached_property
    def local_sizes(self) -> tuple[int, ...]:
        """Size of each digit of the local index."""
        return tuple(self.mode_sizes[m] for m in self.local_modes)

    @cached_property
    def num_threads(self) -> int:
        """Threads the layout spreads the tile over."""
        return math.prod(self.spatial_sizes)

    @cached_property
    def local_size(self) -> int:
        """Elements each thread holds."""
        return math.prod(self.local_sizes)

    @cached_property
    def replication(self) -> int:
        """How many threads hold each element (1 when nothing is replicated)."""
        return math.prod(-m for m in self.spatial_modes if m < 0)

    @property
    def size(self) -> int:
        """Number of logical elements."""
        return math.prod(self.shape)

    # the map and its inverse --------------------------------------------------------
    def logical_index(self, thread: int, local: int) -> tuple[int, ...]:
        """The logical index that ``thread`` holds at position ``local`` of its registers."""
        if not 0 <= thread < self.num_threads:
            raise LayoutError(
                f"logical_index: thread {thread} is outside the layout's "
                f"{self.num_threads} threads"
            )
        if not 0 <= local < self.local_size:
            raise LayoutError(
                f"logical_index: local {local} is outside the layout's "
                f"{self.local_size} elements per thread"
            )
        index = [0] * self.rank
        for entries, sizes, value in (
            (self.spatial_modes, self.spatial_sizes, thread),
            (self.local_modes, self.local_sizes, local),
        ):
            for m, s in zip(reversed(entries), reversed(sizes)):
                digit, value = value % s, value // s
                if m >= 0:
                    index[self.mode_dims[m]] += digit * self.mode_strides[m]
        return tuple(index)

    def owners(self, index: Sequence[int]) -> list[tuple[int, int]]:
        """Every ``(thread, local)`` that holds the element at ``index`` (sorted)."""
        index = tuple(int(i) for i in index)
        if len(index) != self.rank or any(
            not 0 <= i < s for i, s in zip(index, self.shape)
        ):
            raise LayoutError(f"owners: index {index} is outside the shape {self.shape}")
        digits = [0] * len(self.mode_sizes)
        for d, modes in enumerate(self.mode_shape):
            value = index[d]
            first = sum(len(m) for m in self.mode_shape[:d])
            for j in reversed(range(len(modes))):
                digits[first + j] = value % modes[j]
                value //= modes[j]
        local = 0
        for m, s in zip(self.local_modes, self.local_sizes):
            local = local * s + digits[m]
        choices = [
            [digits[m]] if m >= 0 else list(range(-m)) for m in self.spatial_modes
        ]
        threads = []
        for combo in itertools.product(*choices):
            t = 0
            for digit, s in zip(combo, self.spatial_sizes):
                t = t * s + digit
            threads.append(t)
        return sorted((t, local) for t in threads)

    @cached_property
    def table(self) -> np.ndarray:
        """``table[thread, local]`` = logical index, an int64 array ``[T, L, rank]``."""
        t = np.arange(self.num_threads, dtype=np.int64)[:, None]
        l_ = np.arange(self.local_size, dtype=np.int64)[None, :]
        out = np.zeros((self.num_threads, self.local_size, self.rank), dtype=np.int64)
        for entries, sizes, value in (
            (self.spatial_modes, self.spatial_sizes, t),
            (self.local_modes, self.local_sizes, l_),
        ):
            stride = 1
            for m, s in zip(reversed(entries), reversed(sizes)):
                if m >= 0:
                    digit = (value // stride) % s
                    out[..., self.mode_dims[m]] += digit * self.mode_strides[m]
                stride *= s
        out.setflags(write=False)
        return out

    @cached_property
    def flat_table(self) -> np.ndarray:
        """``flat_table[thread, local]`` = row-major flat logical index, ``[T, L]``."""
        flat = np.ravel_multi_index(
            tuple(self.table[..., d] for d in range(self.rank)), self.shape
        )
        flat.setflags(write=False)
        return flat

    # equality ---------------------------------------------------------------------
    @cached_property
    def _key(self) -> tuple:
        return (self.shape, self.num_threads, self.local_size, self.flat_table.tobytes())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RegisterLayout):
            return NotImplemented
        return self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __repr__(self) -> str:
        what = self.recipe or (
            f"modes={self.mode_shape}, spatial={self.spatial_modes}, "
            f"local={self.local_modes}"
        )
        return (
            f"RegisterLayout({what}; shape={list(self.shape)}, threads={self.num_threads}"
            f", local_size={self.local_size})"
        )

    def __str__(self) -> str:
        return self.recipe or repr(self)

    # combinators --------------------------------------------------------------------
    def __mul__(self, other: RegisterLayout) -> RegisterLayout:
        return compose(self, other)

    def local(self, *shape: int) -> RegisterLayout:
        """``self * local(*shape)``."""
        return compose(self, local(*shape))

    def spatial(self, *shape: int) -> RegisterLayout:
        """``self * spatial(*shape)``."""
        return compose(self, spatial(*shape))

    def column_local(self, *shape: int) -> RegisterLayout:
        """``self * column_local(*shape)``."""
        return compose(self, column_local(*shape))

    def column_spatial(self, *shape: int) -> RegisterLayout:
        """``self * column_spatial(*shape)``."""
        return compose(self, column_spatial(*shape))


def _primitive(shape: Sequence[int], is_spatial: bool, column: bool, name: str) -> RegisterLayout:
    dims = _check_shape(shape, name)
    order = list(range(len(dims)))
    if column:
        order.reverse()
    entries = tuple(order)
    recipe = f"{name}({', '.join(str(s) for s in dims)})"
    return RegisterLayout(
        shape=dims,
        mode_shape=tuple((s,) for s in dims),
        spatial_modes=entries if is_spatial else (),
        local_modes=() if is_spatial else entries,
        recipe=recipe,
    )


def local(*shape: int) -> RegisterLayout:
    """One thread holds the whole tile, row-major (local index = row-major position)."""
    return _primitive(shape, False, False, "local")


def column_local(*shape: int) -> RegisterLayout:
    """One thread holds the whole tile, column-major."""
    return _primitive(shape, False, True, "column_local")


def spatial(*shape: int) -> RegisterLayout:
    """One element per thread, threads numbered row-major over the tile."""
    return _primitive(shape, True, False, "spatial")


def column_spatial(*shape: int) -> RegisterLayout:
    """One element per thread, threads numbered column-major over the tile."""
    return _primitive(shape, True, True, "column_spatial")


def _join_recipe(a: RegisterLayout, b: RegisterLayout) -> str:
    if a.recipe and b.recipe:
        if b.recipe.startswith(("local(", "spatial(", "column_local(", "column_spatial(")) and (
            "(" in a.recipe
        ):
            return f"{a.recipe}.{b.recipe}"
        return f"({a.recipe}) * ({b.recipe})"
    return ""


def compose(outer: RegisterLayout, inner: RegisterLayout) -> RegisterLayout:
    """Replace every element of ``outer`` by a tile laid out as ``inner``.

    The result has shape ``outer.shape * inner.shape`` (elementwise), thread index
    ``outer_thread * inner.num_threads + inner_thread`` and local index
    ``outer_local * inner.local_size + inner_local``.
    """
    if outer.rank != inner.rank:
        raise LayoutError(
            f"compose: layouts of different rank cannot be composed: {outer} has rank "
            f"{outer.rank}, {inner} has rank {inner.rank}"
        )
    # New mode ids: per dim, outer's modes (more significant) then inner's.
    new_outer: dict[int, int] = {}
    new_inner: dict[int, int] = {}
    next_id = outer_id = inner_id = 0
    for d in range(outer.rank):
        for _ in outer.mode_shape[d]:
            new_outer[outer_id] = next_id
            outer_id += 1
            next_id += 1
        for _ in inner.mode_shape[d]:
            new_inner[inner_id] = next_id
            inner_id += 1
            next_id += 1

    def remap(entries: tuple[int, ...], ids: dict[int, int]) -> tuple[int, ...]:
        return tuple(ids[m] if m >= 0 else m for m in entries)

    return RegisterLayout(
        shape=tuple(a * b for a, b in zip(outer.shape, inner.shape)),
        mode_shape=tuple(a + b for a, b in zip(outer.mode_shape, inner.mode_shape)),
        spatial_modes=remap(outer.spatial_modes, new_outer)
        + remap(inner.spatial_modes, new_inner),
        local_modes=remap(outer.local_modes, new_outer) + remap(inner.local_modes, new_inner),
        recipe=_join_recipe(outer, inner),
    )


def reduce(layout: RegisterLayout, dims: Sequence[int], keepdims: bool = False) -> RegisterLayout:
    """The layout of ``layout``'s tile after reducing over ``dims``.

    Threads that held different elements along ``dims`` now hold the same reduced
    element (replication); local registers along ``dims`` disappear. With ``keepdims``
    the reduced dims stay with size 1, which is what broadcasting back needs.
    """
    dims_set = set()
    for d in dims:
        if not isinstance(d, (int, np.integer)) or not -layout.rank <= d < layout.rank:
            raise LayoutError(
                f"reduce: dims must be integers in [{-layout.rank}, {layout.rank}), "
                f"got {list(dims)!r} for a rank-{layout.rank} layout"
            )
        dims_set.add(int(d) % layout.rank)
    kept_modes = [
        m for m in range(len(layout.mode_sizes)) if layout.mode_dims[m] not in dims_set
    ]
    renumber = {old: new for new, old in enumerate(kept_modes)}
    spatial_modes = tuple(
        renumber[m] if m >= 0 and m in renumber else (m if m < 0 else -layout.mode_sizes[m])
        for m in layout.spatial_modes
    )
    local_modes = tuple(renumber[m] for m in layout.local_modes if m in renumber)
    if keepdims:
        shape = tuple(1 if d in dims_set else s for d, s in enumerate(layout.shape))
        mode_shape = tuple(
            () if d in dims_set else modes for d, modes in enumerate(layout.mode_shape)
        )
    else:
        shape = tuple(s for d, s in enumerate(layout.shape) if d not in dims_set)
        mode_shape = tuple(
            modes for d, modes in enumerate(layout.mode_shape) if d not in dims_set
        )
        if not shape:
            shape, mode_shape = (1,), ((),)
    recipe = f"reduce({layout.recipe}, dims={sorted(dims_set)})" if layout.recipe else ""
    return RegisterLayout(shape, mode_shape, spatial_modes, local_modes, recipe=recipe)


def concat(lhs: RegisterLayout, rhs: RegisterLayout) -> RegisterLayout:
    """A layout of rank ``lhs.rank + rhs.rank``: ``lhs``'s dims then ``rhs``'s.

    Thread index ``lhs_thread * rhs.num_threads + rhs_thread``, local index likewise.
    """
    shift = len(lhs.mode_sizes)

    def moved(entries: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(m + shift if m >= 0 else m for m in entries)

    recipe = f"concat({lhs.recipe}, {rhs.recipe})" if lhs.recipe and rhs.recipe else ""
    return RegisterLayout(
        shape=lhs.shape + rhs.shape,
        mode_shape=lhs.mode_shape + rhs.mode_shape,
        spatial_modes=lhs.spatial_modes + moved(rhs.spatial_modes),
        local_modes=lhs.local_modes + moved(rhs.local_modes),
        recipe=recipe,
    )


def permute(layout: RegisterLayout, dims: Sequence[int]) -> RegisterLayout:
    """The same threads and registers, with the tile's dims reordered (a transpose)."""
    dims = tuple(int(d) for d in dims)
    if sorted(dims) != list(range(layout.rank)):
        raise LayoutError(
            f"permute: dims must be a permutation of {list(range(layout.rank))}, got "
            f"{list(dims)}"
        )
    old_first = [sum(len(m) for m in layout.mode_shape[:d]) for d in range(layout.rank)]
    renumber: dict[int, int] = {}
    next_id = 0
    for d in dims:
        for j in range(len(layout.mode_shape[d])):
            renumber[old_first[d] + j] = next_id
            next_id += 1
    recipe = f"permute({layout.recipe}, {list(dims)})" if layout.recipe else ""
    return RegisterLayout(
        shape=tuple(layout.shape[d] for d in dims),
        mode_shape=tuple(layout.mode_shape[d] for d in dims),
        spatial_modes=tuple(renumber[m] if m >= 0 else m for m in layout.spatial_modes),
        local_modes=tuple(renumber[m] for m in layout.local_modes),
        recipe=recipe,
    )


def split_pairs(layout: RegisterLayout, span: int) -> RegisterLayout:
    """``layout`` with each run of ``span`` locals reordered: even locals first, then odd.

    Local ``a * span/2 + i`` (``a`` in 0, 1) of the result is local ``2 * i + a`` of
    ``layout`` within the same run; threads and elements are unchanged. Why: a bit-trick
    cast of integer codes decodes lanes 0 and 1 of a 32-bit word from codes ``i`` and
    ``i + span/2`` (1/2/4 bits: of one word; 3/5/6/7 bits: of two words spliced); stored
    in this order, those two codes are a register pair ``(2i, 2i + 1)`` of ``layout``.
    ``span`` must be a power of two dividing the local size, and the low ``log2(span)``
    bits of the local index must come from power-of-two local modes.
    """
    if span < 2 or span & (span - 1) or layout.local_size % span:
        raise LayoutError(
            f"split_pairs: span must be a power of two >= 2 dividing the local size "
            f"{layout.local_size}, got {span!r}"
        )
    # split every local mode into size-2 modes (same dim, same place: strides are kept)
    pieces: dict[int, list[int]] = {}
    mode_shape: list[tuple[int, ...]] = []
    sizes_out: list[int] = []
    local_set = set(layout.local_modes)
    m = 0
    for modes in layout.mode_shape:
        dim_sizes: list[int] = []
        for size in modes:
            if m in local_set and size & (size - 1) == 0:
                bits = size.bit_length() - 1
                pieces[m] = list(range(len(sizes_out), len(sizes_out) + bits))
                sizes_out.extend([2] * bits)
                dim_sizes.extend([2] * bits)
            else:
                pieces[m] = [len(sizes_out)]
                sizes_out.append(size)
                dim_sizes.append(size)
            m += 1
        mode_shape.append(tuple(dim_sizes))
    digits = [p for mode in layout.local_modes for p in pieces[mode]]
    low = span.bit_length() - 1
    if len(digits) < low or any(sizes_out[d] != 2 for d in digits[-low:]):
        raise LayoutError(
            f"split_pairs: the low {low} bits of {layout}'s local index are not all "
            "power-of-two local modes"
        )
    run = digits[-low:]
    digits = digits[:-low] + [run[-1]] + run[:-1]
    spatial_modes = tuple(pieces[s][0] if s >= 0 else s for s in layout.spatial_modes)
    recipe = f"split_pairs({layout.recipe}, {span})" if layout.recipe else ""
    return RegisterLayout(layout.shape, tuple(mode_shape), spatial_modes, tuple(digits),
                          recipe=recipe)


def local_permutation(src: RegisterLayout, dst: RegisterLayout) -> np.ndarray | None:
    """``perm`` with ``dst``'s local ``l`` = ``src``'s local ``perm[l]`` in every thread.

    None when the two layouts do not give every thread the same elements, or reorder them
    differently in different threads (then no register renaming turns one into the other).
    """
    if (src.shape != dst.shape or src.num_threads != dst.num_threads
            or src.local_size != dst.local_size):
        return None
    order_src = np.argsort(src.flat_table, axis=1, kind="stable")
    sorted_src = np.take_along_axis(src.flat_table, order_src, axis=1)
    pos = np.searchsorted(sorted_src[0], dst.flat_table[0])
    if (pos >= src.local_size).any():
        return None
    perm = order_src[0][pos]
    if not np.array_equal(src.flat_table[:, perm], dst.flat_table):
        return None
    return perm
