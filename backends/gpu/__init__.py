"""The real engine: a torch device (CUDA with two streams and FlashInfer, or CPU), a compact
decoder, and Hugging Face `transformers` as the reference. Needs the `real` extra (and `cuda`)."""
