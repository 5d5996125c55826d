/* SPDX-License-Identifier: Apache-2.0 */
/* What the README's C snippets take from the engine around them: declared
 * here so that tests/test_readme_c.sh compiles each snippet as written. */
#ifndef KVF_README_STUBS_H
#define KVF_README_STUBS_H
#ifndef KVFERRY_H
#error "a README C block that uses kvferry must #include <kvferry.h> itself"
#endif

extern kvf_engine *e;             /* the engine, in the cache snippet */
extern void *engine_kv_tensor;    /* the engine's GPU KV blocks */
extern void *compute_stream;      /* its CUDA stream */
extern const uint32_t *token_ids; /* a request's tokens */
extern size_t n_tokens;
extern uint64_t lora_salt;
extern kvf_key key; /* a block key, in the snippets of disk moves */
extern kvf_key keys[2];
extern uint32_t my_gpu_slots[64];
void recompute_block(uint32_t slot);
extern const kvf_move *moves; /* a batch of moves, in the layer-wise snippet */
extern size_t n;
void launch_layer(uint32_t layer, void *stream);
#endif
