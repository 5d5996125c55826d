# SPDX-License-Identifier: Apache-2.0
"""The vLLM connector's map from vLLM's KV cache to kvferry's pools, slots
and keys, apart from vLLM's classes so that it imports without vLLM (the
GPU tests run it on machines where vLLM is not installed): KV cache groups
and their keys, KV tensors (K/V split, MLA's one latent, a Mamba layer's
state page) cut into pools, the blocks of each group a hit loads (a sliding
window only those it reaches, a Mamba group the state at the hit's end),
the part of a load still held, and what a layer waits for.
Neither vLLM nor torch is imported here: the connector passes its config
and tensors in."""

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from .._cache import Cache, key_salt
from .._enums import Status
from .._errors import KvferryError, make_error
from ._serving import TensorPool, tensor_pools


def block_key(block_hash: bytes, salt: int = 0) -> int:
    """kvferry's 128-bit key for one of vLLM's block hashes
    (Request.block_hashes, vLLM's hasher, sha256 by default, over the
    block's tokens, its parent's hash and the extra keys: cache_salt, LoRA,
    multimodal inputs, prompt embeddings): the hash's first 16 bytes,
    little-endian, xor the connector's salt; never 0 (the root). The one
    place a key is derived."""
    if len(block_hash) < 16:
        raise make_error(Status.ERR_INVALID, f"KvferryConnector: a block hash of {len(block_hash)} bytes "
                         f"(want at least 16)")
    return (int.from_bytes(bytes(block_hash[:16]), "little") ^ salt) or 1


@dataclass(frozen=True)
class _Group:
    """One of vLLM's KV cache groups (layers of one attention kind sharing
    a block table; a hybrid model has several): its blocks' keys carry the
    group's salt, so two groups never share a key, and a sliding-window
    group's hit needs only the blocks its window reaches. A state group
    (Mamba / linear attention: vLLM's MambaSpec in its "align" mode) holds
    in block j the recurrent state after the prefix's first j + 1 blocks:
    a hit needs that one block, and only vLLM says which blocks hold such
    a state (its boundary-state hand-offs), never their position."""

    index: int
    window: bool
    salt: int
    state: bool = False


# the KV cache specs whose blocks are a function of the prefix alone (full
# attention, MLA's latent, a sliding window's blocks), by class name
_SERVED_SPECS = {"FullAttentionSpec": False, "MLAAttentionSpec": False, "SlidingWindowSpec": True,
                 "SlidingWindowMLASpec": True}


def _state_ident(spec) -> str:
    """What makes a state block's bytes beyond the prefix that produced
    it: the state's tensors (shapes, element types), its padded page and
    the kernel family that writes it (Mamba2, GDN, ...). vLLM views the
    state as raw bytes, so the namespace's layout tag cannot see them."""
    return (f"state {type(spec).__name__} {tuple(spec.shapes)} {tuple(str(d) for d in spec.dtypes)} "
            f"{getattr(spec, 'page_size_padded', None)} {getattr(spec, 'mamba_type', None)}")


def kv_groups(kv_cache_config, block_size: int, salt: int) -> List[_Group]:
    """kvferry's view of the KV cache groups, checked: a group of another
    kind (chunked local attention, cross-attention), a Mamba group whose
    state vLLM keeps per request only (mamba_cache_mode "none") or a group
    of another block size is refused, naming the group and the setting."""
    groups = list(getattr(kv_cache_config, "kv_cache_groups", None) or ())
    if not groups:
        return [_Group(0, False, salt)]
    out = []
    for i, g in enumerate(groups):
        spec = g.kv_cache_spec
        name = type(spec).__name__
        what = f"KvferryConnector: KV cache group {i} ({name}, layers {', '.join(list(g.layer_names)[:2])}" \
               f"{', ...' if len(g.layer_names) > 2 else ''})"
        state = name == "MambaSpec"
        if not state and name not in _SERVED_SPECS:
            raise make_error(Status.ERR_UNSUPPORTED, f"{what}: kvferry stores {', '.join(sorted(_SERVED_SPECS))} "
                             f"and MambaSpec groups only")
        mode = getattr(spec, "mamba_cache_mode", "none") if state else None
        if state and mode != "align":
            # "none": one running state per request, overwritten every step;
            # no block ever holds the state at a block boundary to key
            raise make_error(Status.ERR_UNSUPPORTED, f"{what}: cache_config.mamba_cache_mode is {mode!r}; kvferry "
                             f"stores a Mamba group's state at block boundaries, which vLLM keeps only with "
                             f"mamba_cache_mode 'align' (enable_prefix_caching on; vLLM sets 'none' without it)")
        if int(spec.block_size) != block_size:
            raise make_error(Status.ERR_INVALID, f"{what}: block_size {spec.block_size} is not the cache's "
                             f"block_size {block_size} (vLLM's block hashes are at {block_size} tokens)")
        # one group: the salt alone, so its keys are those of a model
        # without groups; several: each group's layers in its salt
        gsalt = salt if len(groups) == 1 else salt ^ key_salt("kv cache group " + "|".join(g.layer_names))
        if state:  # the state's layout is in its keys, whatever the groups
            gsalt = salt ^ key_salt("kv cache group " + "|".join(g.layer_names) + "|" + _state_ident(spec))
        out.append(_Group(i, _SERVED_SPECS.get(name, False), gsalt, state))
    return out


def _block_dim(t, num_blocks: int, name: str) -> int:
    """The dimension indexing blocks: of size num_blocks, the largest stride
    of those (a K/V dimension of 2 comes first in some backends)."""
    dims = [d for d in range(t.dim()) if t.shape[d] == num_blocks]
    if not dims:
        raise make_error(Status.ERR_INVALID, f"layer {name}: KV tensor of shape {tuple(t.shape)} has no "
                         f"dimension of {num_blocks} blocks")
    return max(dims, key=lambda d: t.stride(d))


def tensor_ident(t) -> Tuple[int, tuple]:
    """What tells KV tensors apart: layers sharing one tensor (vLLM shares
    a tensor among layers of different groups) share its pools."""
    return t.data_ptr(), tuple(t.shape)


def cut_kv_caches(kv_caches, num_blocks: int, block_size: int, state_layers=frozenset()
                  ) -> Dict[Tuple[int, tuple], List[TensorPool]]:
    """vLLM's {layer name: KV tensor} as pools, per distinct tensor in layer
    order (the order a layer-wise load lands in): a K/V split gives a pool
    per K and V, MLA's latent one pool, a state layer (state_layers: Mamba
    groups' layers, which vLLM views as raw bytes) its whole page, the
    state and the padding vLLM adds to make it an attention page. A pool
    whose bytes are another's (a state page and the attention page vLLM
    overlays on the same memory) is that pool: the same list, registered
    once (unique_pools), so a block is stored once whatever its group."""
    cut: Dict[Tuple[int, tuple], List[TensorPool]] = {}
    seen: Dict[Tuple[int, int, int], List[TensorPool]] = {}
    for name, t in kv_caches.items():
        ident = tensor_ident(t)
        if ident in cut:
            continue
        dim = _block_dim(t, num_blocks, name)
        if name in state_layers:
            if dim != 0:
                raise make_error(Status.ERR_INVALID, f"layer {name}: state tensor of shape {tuple(t.shape)} does "
                                 f"not index blocks in its first dimension")
            try:  # the page: a block's stride of bytes from its start
                t = t.as_strided((num_blocks, t.stride(0)), (t.stride(0), 1))
            except RuntimeError as exc:
                raise make_error(Status.ERR_INVALID, f"layer {name}: its state pages do not fit the tensor's "
                                 f"memory: {exc}") from None
        pools = tensor_pools(t, dim, block_size, f"layer {name}")
        same = (pools[0].buffer.ptr, pools[0].slot_stride, pools[0].geometry.block_bytes) if len(pools) == 1 else None
        if same is not None and same in seen:
            pools = seen[same]
        elif same is not None:
            seen[same] = pools
        cut[ident] = pools
    return cut


def unique_pools(cut: Dict[Tuple[int, tuple], List[TensorPool]]) -> List[List[TensorPool]]:
    """The distinct pool lists of a cut, in layer order: each registered
    once."""
    out: Dict[int, List[TensorPool]] = {}
    for pools in cut.values():
        out.setdefault(id(pools), pools)
    return list(out.values())


def first_needed(g: _Group, blocks: int, local: int, block_size: int,
                 skipped: Optional[Callable[[int], int]]) -> int:
    """The first block of group g a hit of `blocks` blocks must bring (the
    engine holds those before `local`): `local` for full attention; for a
    sliding window, the first its window reaches from the hit's end, by
    skipped (tokens -> the tokens before the window, vLLM's
    get_num_skipped_tokens of the group's manager; None: every block); for
    a state group, the hit's last block (the state after it)."""
    if g.state:
        return max(local, blocks - 1)
    if not g.window or skipped is None:
        return local
    return max(local, skipped(blocks * block_size) // block_size)


def group_loads(groups: Sequence[_Group], keys: Sequence[List[int]], block_ids: Sequence[List[int]], first: int,
                end: int, null: int, needed: Callable[[_Group, int, int], int]) -> List[Tuple[List[int], List[int]]]:
    """A hit of blocks first..end as loads, one per group that has any:
    (its keys, vLLM's block ids), from needed(g, end, first) on (a window's
    blocks before it are vLLM's null block, never loaded)."""
    out = []
    for g, gkeys, ids in zip(groups, keys, block_ids):
        start = needed(g, end, first)
        pairs = [(k, b) for k, b in zip(gkeys[start:end], ids[start:end]) if b != null]
        if pairs:
            out.append(([k for k, _ in pairs], [b for _, b in pairs]))
    return out


def held_prefixes(cache: Cache, loads: Sequence[Tuple[List[int], List[int]]]
                  ) -> Tuple[List[int], List[int], List[int]]:
    """Of loads [(keys, blocks), ...], each a prefix of one group: the keys
    and blocks still held, as one get's, and the blocks that are not (a
    block evicted since the scheduler looked fails with the rest of its
    list: a prefix with a hole is no prefix)."""
    keys: List[int] = []
    slots: List[int] = []
    missing: List[int] = []
    for k, ids in loads:
        hits, _ = cache.lookup(k)
        keys += k[:hits]
        slots += ids[:hits]
        missing += ids[hits:]
    return keys, slots, missing


def wait_layer(ticket, pools: Sequence[int], cuda: bool) -> None:
    """Makes a layer's attention see its blocks: on the GPU, torch's current
    stream waits for the layer's pools (the host does not); on the host
    backend this thread waits. A failed block is no error here: the load's
    failures are reported after the forward."""
    for p in pools:
        try:
            if cuda:
                ticket.stream_wait_pool(p, None)
            else:
                ticket.wait_pool(p)
        except KvferryError:
            pass
