//! Real GPUs through the CUDA driver API, loaded at run time.
