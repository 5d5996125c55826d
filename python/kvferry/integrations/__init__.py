# SPDX-License-Identifier: Apache-2.0
"""Adapters between kvferry and serving engines; each module imports its
engine only when it is imported itself, so `import kvferry` never needs one."""
