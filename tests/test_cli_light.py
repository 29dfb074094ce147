"""`specdec --help` answers at once: the parser imports neither torch nor transformers (cli.py)."""

import subprocess
import sys


def test_the_parser_imports_no_torch():
    code = ("import sys; from specdec_learn import cli\n"
            "try:\n    cli.main(['bench', '--help'])\nexcept SystemExit:\n    pass\n"
            "heavy = sorted(m for m in ('torch', 'transformers') if m in sys.modules)\n"
            "assert not heavy, f'--help imported {heavy}'")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "--draft-vocab" in run.stdout


def test_the_package_loads_what_it_exports_on_first_use():
    code = ("import sys, specdec_learn as sd\n"
            "assert 'torch' not in sys.modules\n"
            "assert sd.NgramDrafter.__name__ == 'NgramDrafter' and sd.TreeSpec.parse('8,3').nodes == 8\n"
            "assert 'specdec_learn.drafters.dflash' not in sys.modules  # only the drafter asked for\n"
            "from specdec_learn import drafters\n"
            "for name in sd.__all__:  # every name the package exports resolves, each drafter class included\n"
            "    assert getattr(sd, name) is not None, name\n"
            "for name in drafters.__all__:\n"
            "    assert getattr(drafters, name) is not None, name\n"
            "assert sd.quiet.__name__ == 'specdec_learn.quiet' and sd.load.__module__ == 'specdec_learn.target'")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
