"""The README's Python example runs as written."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_blocks_run(capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks
    for code in blocks:
        exec(compile(code, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "compute" in out or "communication" in out or "bubble" in out


def test_readme_shows_both_commands():
    text = README.read_text()
    assert "pip install . && perfmodel predict --model gpt2-small --gpu h200 --micro-batch 8" in text
    ci = (README.parent / ".ci" / "run").read_text()
    command = ('pip install ".[test,torch]" && python -m ruff check . && lint-imports && '
               'python -m pytest -n auto --dist loadfile -m "not timing" && python -m pytest -m timing')
    assert command in text and command in ci
