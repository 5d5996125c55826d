/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Settings of engines and caches from the caller's struct, the environment
 * and a YAML file (config.c), shared by engine.c and cache.c.
 */
#ifndef KVF_CONFIG_H
#define KVF_CONFIG_H

#include "common.h"

/*
 * Fills *out from *caller (a full struct, every field present): a field at
 * its KVF_ENGINE_CONFIG_INIT value is taken from the environment, else the
 * config file (config_file or $KVF_CONFIG), else the default. The strings
 * of *out point into *settings_p (one allocation, free()), which lists
 * every setting with its source. out may be caller.
 */
KVF_INTERNAL kvf_status kvf__engine_config_resolve(const kvf_engine_config *caller,
                                                   kvf_engine_config *out, kvf_setting **settings_p,
                                                   size_t *n_p);

/*
 * As kvf__engine_config_resolve for a cache, with the config file the
 * engine resolved (NULL: none). block_bytes > 0 turns host.bytes and
 * disk.bytes into host.blocks and disk.blocks (rounded down; less than one
 * block is KVF_ERR_RANGE); 0 leaves them as bytes.
 */
KVF_INTERNAL kvf_status kvf__cache_config_resolve(const kvf_cache_config *caller,
                                                  const char *config_file, size_t block_bytes,
                                                  kvf_cache_config *out, kvf_setting **settings_p,
                                                  size_t *n_p);

/* The source of setting `name` in settings[0..n); DEFAULT when absent. */
KVF_INTERNAL kvf_setting_source kvf__setting_source(const kvf_setting *settings, size_t n,
                                                    const char *name);

#endif /* KVF_CONFIG_H */
