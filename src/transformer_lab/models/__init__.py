"""The models: the encoder-decoder (:mod:`.encoder_decoder`) and the GPT (:mod:`.gpt`) on the
core's functions, their configurations (:mod:`.config`), input checks (:mod:`.inputs`), the
parameter handling they share (:mod:`.shell`) and their one checkpoint format
(:mod:`.checkpoints`)."""
