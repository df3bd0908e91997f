"""Model files rewritten for the store: a GGUF quantized tensor by tensor, a Hugging Face
safetensors folder converted to a GGUF.

Nothing here imports numpy or the ``gguf`` package at module level except the modules that
do the work (:mod:`.quantize`, :mod:`.hf_import`), which ``store/create.py`` imports only
when a create asks for them: a server that never converts never pays for numpy.

The modules: :mod:`.policy` (which type each tensor gets; pure), :mod:`.rows` (tensor rows
read from a file as float32 and encoded to a GGUF type, a slice at a time),
:mod:`.ggml_quants` (the block types, K-quants among them, made by ggml in the engine's
library),
:mod:`.gguf_out` (a GGUF written header first, then one tensor at a time),
:mod:`.quantize` (a GGUF to another type), :mod:`.safetensors` (a shard's header),
:mod:`.hf_tokenizer` and :mod:`.hf_llama` (a Hugging Face tokenizer and llama-family config
as GGUF metadata and tensors), :mod:`.hf_import` (a folder's files to a GGUF).
"""
