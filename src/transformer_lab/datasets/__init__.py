"""Data: the toy tasks of the encoder-decoder (:mod:`.tasks`), the translation data of notebook
12 (:mod:`.translation`), the text corpus of the GPT (:mod:`.corpus`), and the files the package
ships (``shipped/``: notebook 13's trained GPT and its block comparison, notebook 12's trained
translators)."""

from pathlib import Path

#: The folder of the files the package ships.
SHIPPED = Path(__file__).resolve().parent / "shipped"
