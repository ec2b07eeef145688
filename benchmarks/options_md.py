"""Print docs/options.md: every option of every command, from the code (mtpbench.cli.help.options_markdown).

    python benchmarks/options_md.py > docs/options.md

tests/unit/test_help.py fails while the file differs from what this prints."""

import typer

from mtpbench.cli import app
from mtpbench.cli.help import options_markdown

group = typer.main.get_command(app)
print(options_markdown(group, list(group.commands)), end="")
