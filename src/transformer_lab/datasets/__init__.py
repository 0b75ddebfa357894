"""Data: the toy tasks of the encoder-decoder (:mod:`.tasks`), the text corpus of the GPT
(:mod:`.corpus`), and the files the package ships (``shipped/``: notebook 09's trained GPT and
its block comparison)."""

from pathlib import Path

#: The folder of the files the package ships.
SHIPPED = Path(__file__).resolve().parent / "shipped"
