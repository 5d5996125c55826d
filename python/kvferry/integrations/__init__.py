# SPDX-License-Identifier: Apache-2.0
"""Adapters between kvferry and inference frameworks and serving engines.
Each lives in its own module and imports its framework only when imported
itself, so `import kvferry` never needs one:

    from kvferry.integrations.transformers import KVFerryPrefixCache
    from kvferry.integrations.vllm import KvferryConnector
    from kvferry.integrations.sglang import KvferryStorage
"""
