"""Integrations of hanpu's GDN and KDA functions into other libraries (docs/PYTHON.md).

`hanpu.integrations.transformers` routes the linear-attention kernels of Hugging Face
transformers' hybrid models to hanpu. Nothing here is imported by `import hanpu`: importing a
submodule imports the library it integrates with.
"""
