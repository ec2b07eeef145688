"""report.html: one self-contained page per run (``document``), its tables from mtpbench's Markdown
(``markdown``); each feature builds its own (``<feature>/page.py``), ``pages.write_page`` picks by what a directory
holds."""
