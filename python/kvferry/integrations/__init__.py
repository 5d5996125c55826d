# SPDX-License-Identifier: Apache-2.0
"""Adapters between kvferry and inference frameworks. Each lives in its own
module and imports its framework only when imported itself:

    from kvferry.integrations.transformers import KVFerryPrefixCache
"""
