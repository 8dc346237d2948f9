"""The package's version and the llama.cpp build whose outputs it reproduces (llama.cpp's build-info.cpp:
LLAMA_BUILD_NUMBER / LLAMA_COMMIT). A leaf module: every front end that prints a version imports it from here, so no
module inside the package imports the package itself."""

__version__ = "0.1.0"
LLAMA_CPP_BUILD = "0c1e570"  # the llama.cpp build whose logits llamactx reproduces (tests/data/REFERENCE.md)
