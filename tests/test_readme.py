"""The README's Python examples run as written."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_block_runs(index, tmp_path, monkeypatch):
    path = tmp_path / f"readme_block_{index}.py"  # triton.jit needs the source in a file
    path.write_text(BLOCKS[index])
    monkeypatch.syspath_prepend(str(tmp_path))
    code = compile(BLOCKS[index], str(path), "exec")
    exec(code, {"__name__": f"readme_block_{index}"})
