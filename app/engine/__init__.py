"""The engine's stages, one module each, joined by bounded queues.

admission → tokenization → batching (assembly) → inference → postprocess
"""
