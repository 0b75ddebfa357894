"""The models: the encoder-decoder (:mod:`.encoder_decoder`) and the GPT (:mod:`.gpt`) on the
core's functions, their configurations (:mod:`.config`), input checks (:mod:`.inputs`), the
parameter handling they share (:mod:`.shell`) and their one checkpoint format
(:mod:`.checkpoints`); GPT-2's and LLaMA-architecture checkpoints as Hugging Face
``transformers`` writes them, read into the GPT (:mod:`.pretrained`, :mod:`.llama`, on the
folder reader :mod:`.hf_checkpoint`; ``GPT.from_pretrained``). They compute with the core's
functions and nothing else: in the handout, with the student's own."""
