"""The `specdec` command.

    specdec bench --model smollm2-135m --methods ar,ngram --k 1,3,5 \
        --workload humaneval --prompts 10 --max-new-tokens 128 --json results.json
    specdec generate --prompt "Write a haiku about tea." --method ngram --k 3
"""

from __future__ import annotations

import argparse
import sys

from .methods import names

# The parser needs only the methods' names: what runs a command (torch, transformers, the drafters) is
# imported by the command itself, so that `specdec --help` answers at once.


def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _tree(text: str):
    """NODES,DEPTH[,BRANCH], as --tree takes it (tree.TreeSpec.parse)."""
    from .tree import TreeSpec

    try:
        return TreeSpec.parse(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _method_folder(text: str) -> tuple[str, str]:
    """METHOD=DIR, as --drafter takes it."""
    method, sep, folder = text.partition("=")
    if not sep or method not in names() or not folder:
        raise argparse.ArgumentTypeError(f"expected METHOD=DIR with METHOD one of {', '.join(names())}, got {text!r}")
    return method, folder


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2-135m", help="embedded name, local HF directory or hub id")
    p.add_argument("--dtype", choices=["auto", "bf16", "fp32", "fp16"], default="auto",
                   help="auto (the default): bf16 on a GPU or a CPU with bf16 instructions, else fp32")
    p.add_argument("--no-invariant", dest="invariant", action="store_false",
                   help="keep torch's own CPU kernels: a row's bits may then depend on how many rows a pass "
                        "computes, and greedy speculation may differ from plain decoding (invariant.py)")
    p.add_argument("--device", default=None, help="cpu or cuda (ROCm GPUs are 'cuda' too); default: GPU if present")
    p.add_argument("--cache-dir", default=None, help="where converted models go (default: $SPECDEC_CACHE or ~/.cache/specdec_learn)")
    p.add_argument("--draft", default=None,
                   help="the drafter's checkpoint, a folder or hub id, for the methods that load one ("
                        f"{', '.join(names(lambda m: m.draft is not None))}); default: the one shipped for the "
                        "target, or the target's own MTP layers; draft_model also takes 'target'")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backend", choices=["native", "vllm"], default="native",
                   help="native: the readable loop; vllm: the same recipe through vLLM (its own environment: make vllm-env)")
    p.add_argument("--vllm-option", action="append", default=[], metavar="KEY=VALUE",
                   help="an option for vllm.LLM, e.g. tensor_parallel_size=2 (repeatable; values read as JSON)")
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,  # SUPPRESS: keep `specdec --debug`
                   help="on an error, show the whole traceback")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specdec", description="Speculative decoding, readable and measured.")
    sub = parser.add_subparsers(dest="command", required=True)

    b = sub.add_parser("bench", help="methods x k over a workload, with speedups vs AR")
    _common(b)
    b.add_argument("--methods", default="ar,ngram", help=f"comma-separated, from: {', '.join(names())}")
    b.add_argument("--k", type=_int_list, default=[1, 3, 5], help="comma-separated draft lengths")
    b.add_argument("--workload", default="humaneval", help="humaneval, math, chat, edits, or a JSONL file of {\"prompt\": ...}")
    b.add_argument("--prompts", type=int, default=10, help="number of prompts")
    b.add_argument("--tree", type=_tree, action="append", default=[], metavar="NODES,DEPTH[,BRANCH]",
                   help="also run each method with a token tree of this size (repeatable; a method whose drafter "
                        "drafts chains only is named and runs its chains)")
    b.add_argument("--draft-vocab", type=int, action="append", default=[], metavar="N",
                   help="also run each drafter that scores the whole vocabulary with it cut to its N most frequent "
                        "tokens (repeatable; counted in the committed corpus; EAGLE-3's checkpoint carries "
                        "its own cut)")
    b.add_argument("--drafter", type=_method_folder, action="append", default=[], metavar="METHOD=DIR",
                   help="also run METHOD's chains with the drafter in DIR (e.g. a retrained export) beside "
                        "the default one (repeatable)")
    b.add_argument("--json", default=None, help="write the results here")
    b.add_argument("--batch-size", type=int, default=1, help="prompts per vLLM call (--backend vllm only)")
    b.add_argument("--plot", default=None, help="save the figures here (e.g. bench.png)")
    b.add_argument("--no-progress", action="store_true")

    g = sub.add_parser("generate", help="one prompt, one method; prints the text and the stats")
    _common(g)
    g.add_argument("--prompt", required=True)
    g.add_argument("--method", default="ar", choices=names())
    g.add_argument("--k", type=int, default=3)
    g.add_argument("--tree", type=_tree, default=None, metavar="NODES,DEPTH[,BRANCH]",
                   help="draft a token tree of this size instead of a chain of k")
    g.add_argument("--draft-vocab", type=int, default=None, metavar="N",
                   help="the drafter scores only its N most frequent tokens (drafters that score the whole "
                        "vocabulary; EAGLE-3's checkpoint carries its own cut)")
    # the trainers (and what they import) load only for `specdec train`: `generate`, `bench` and --help skip them
    words = sys.argv[1:] if argv is None else argv
    _add_train_parser(sub, with_trainers=next((w for w in words if not w.startswith("-")), None) == "train")

    parser.add_argument("--debug", action="store_true", help="on an error, show the whole traceback")
    args = parser.parse_args(argv)
    try:
        if args.command == "train":
            return _train(args)
        from .sampling import Sampling

        sampling = Sampling(args.temperature, args.top_k, args.top_p)
        if args.command == "bench":
            return _bench(args, sampling)
        return _generate(args, sampling)
    except KeyboardInterrupt:
        print("specdec: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # the error boundary: one line for the user, the traceback only with --debug
        if getattr(args, "debug", False):
            raise
        print(f"specdec: error: {one_line(err)}", file=sys.stderr)
        return 2


def one_line(err: BaseException) -> str:
    """An exception as the one line a user reads: our messages as they are, anything else with its type and a hint."""
    text = " ".join(str(err).split()) or type(err).__name__
    if isinstance(err, (ValueError, OSError, ModuleNotFoundError)):
        return text
    return f"{type(err).__name__}: {text} (an unexpected failure: rerun with --debug and report the traceback)"


def _bench(args, sampling) -> int:
    from . import bench as bench_mod
    from . import quiet
    from .drafters import branching
    from .models import default_device, resolve_dtype
    from .workloads import load_workload

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if not methods:
        raise ValueError(f"--methods {args.methods!r} names no method: give e.g. ar,ngram (from {', '.join(names())}).")
    unknown = [m for m in methods if m not in names()]
    if unknown:
        raise ValueError(f"Unknown method(s) {', '.join(unknown)}: choose from {', '.join(names())}.")
    if any(m != "ar" for m in methods) and not args.k:
        raise ValueError("--k names no draft length: give e.g. --k 1,3,5 (AR, k = 0, always runs).")
    if args.prompts < 1:
        raise ValueError(f"--prompts must be >= 1, got {args.prompts}.")
    prompts = load_workload(args.workload, n=args.prompts)
    if not prompts:
        raise ValueError(f"The workload {args.workload!r} has no prompts: add lines of {{\"prompt\": ...}}.")
    if args.backend == "vllm":
        if args.tree:
            raise ValueError(NO_VLLM_TREES)
        if args.draft_vocab:
            raise ValueError(NO_VLLM_DRAFT_VOCAB)
        if args.drafter:
            raise ValueError("--drafter runs the readable loop twice over one target; with vLLM run the "
                             "benchmark once per drafter (--draft DIR) instead.")
        target = None
        records = bench_mod.vllm_bench(
            args.model, methods, args.k, prompts, args.max_new_tokens, sampling, args.seed, args.draft, args.dtype,
            args.batch_size, args.cache_dir, **_vllm_options(args),
        )
    else:
        if args.batch_size != 1:
            raise ValueError("The readable loop decodes one prompt at a time: --batch-size needs --backend vllm.")
        chains_only = [m for m in methods if m != "ar" and m not in branching()] if args.tree else []
        if chains_only:
            print(f"--tree: {', '.join(chains_only)} draft{'s' if len(chains_only) == 1 else ''} chains only "
                  f"(trees: {', '.join(branching())}); {'its' if len(chains_only) == 1 else 'their'} chains run",
                  file=sys.stderr)
        target = _load(args)
        records = bench_mod.bench(
            target, methods, args.k, prompts, args.max_new_tokens, sampling, args.seed, args.draft, not args.no_progress,
            args.tree, args.draft_vocab, args.drafter,
        )
    info = bench_mod.machine_info(target)
    vllm_dtype = str(resolve_dtype(args.dtype, args.device or default_device())).replace("torch.", "")
    info.setdefault("dtype", f"vLLM {vllm_dtype}, batch {args.batch_size}")
    if target is None:
        print("[specdec] vLLM batches by its own rules: a row's bits may depend on the pass, and greedy output "
              "may differ from plain decoding in near-ties", file=sys.stderr)
    print(f"\n{args.model} · {info['dtype']} · {info['cpu']} ({info['torch_threads']} threads) · "
          f"{len(prompts)} {args.workload} prompts · {args.max_new_tokens} new tokens")
    print(bench_mod.format_table(records))
    disturbed = quiet.warning(getattr(records, "conditions", None))
    if disturbed:
        print(disturbed, file=sys.stderr)
    if args.json:
        config = {k: v for k, v in vars(args).items() if k not in ("json", "plot", "no_progress", "command")}
        config["methods"], config["num_prompts"] = methods, len(prompts)
        config["tree"] = [vars(t) for t in args.tree]
        config["draft_vocab"] = args.draft_vocab
        config["drafter"] = [list(pair) for pair in args.drafter]
        config["prompt_ids"] = [p.id for p in prompts]
        bench_mod.write_json(args.json, records, target, config)
        print(f"results written to {args.json}")
    if args.plot:
        from .plots import bench_figure, save_figure

        save_figure(bench_figure(records), args.plot)
        print(f"figure written to {args.plot}")
    return 0


def _vllm_options(args) -> dict:
    """--vllm-option KEY=VALUE pairs -> keyword arguments for vllm.LLM (values parsed as JSON when they can be)."""
    import json

    options = {}
    for item in args.vllm_option:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--vllm-option takes KEY=VALUE, e.g. tensor_parallel_size=2; got {item!r}.")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options


# vLLM verified EAGLE trees (`speculative_token_tree`, tree attention) until it removed them in May 2026
# (vllm-project/vllm#42121); the vLLM this backend drives (0.32) has neither, so there is nothing to pass on.
NO_VLLM_TREES = ("--tree runs in the readable loop only: this vLLM verifies chains (it removed tree attention and "
                 "speculative_token_tree). Drop --tree, or use --backend native.")


NO_VLLM_DRAFT_VOCAB = ("--draft-vocab runs in the readable loop only: vLLM reads a reduced vocabulary from the "
                       "checkpoint itself (draft_vocab_size with d2t/t2d). Drop --draft-vocab, or use --backend native.")


def _load(args):
    """The target the arguments name, and one line on stderr saying its dtype and mode."""
    import warnings

    from .invariant import NotRowInvariant, not_invariant
    from .limits import cpu_has_bf16, isa_cap
    from .target import load

    with warnings.catch_warnings():  # the line below says it
        warnings.simplefilter("ignore", NotRowInvariant)
        target = load(args.model, dtype=args.dtype, device=args.device, cache_dir=args.cache_dir,
                      invariant=args.invariant)
    why = ""
    if args.dtype == "auto":
        no = f"this CPU's kernels are capped at {isa_cap()}" if isa_cap() else "this CPU has no bf16 instructions"
        bf16 = {True: "this CPU has bf16 instructions", False: no, None: "bf16 instructions unknown"}[cpu_has_bf16()]
        why = f" (auto: {'a GPU' if target.device.type != 'cpu' else bf16})"
    if target.row_invariant:
        mode = "every row computed alike in passes of any size (speculation reproduces plain decoding to the bit)"
    else:
        reason = "--no-invariant" if not args.invariant else not_invariant(target.model)
        mode = f"torch's own kernels ({reason}: greedy output may differ from plain decoding in near-ties)"
    print(f"[specdec] {target.name}: {str(target.dtype).replace('torch.', '')}{why}, {target.device}, {mode}",
          file=sys.stderr)
    return target


def _generate(args, sampling) -> int:
    if args.backend == "vllm":
        if args.tree:
            raise ValueError(NO_VLLM_TREES)
        if args.draft_vocab:
            raise ValueError(NO_VLLM_DRAFT_VOCAB)
        return _generate_vllm(args, sampling)
    from .decode import generate
    from .zoo import make_drafter

    target = _load(args)
    drafter = make_drafter(args.method, target, draft=args.draft, draft_vocab=args.draft_vocab)
    out = generate(target, args.prompt, drafter, k=0 if args.tree else args.k, max_new_tokens=args.max_new_tokens,
                   sampling=sampling, seed=args.seed, tree=args.tree)
    print(out.text)
    s = out.stats
    shape = f"tree={args.tree.nodes},{args.tree.depth},{args.tree.branch}" if args.tree else f"k={args.k if drafter else 0}"
    print(f"\n[{args.method} {shape}] {s.num_output_tokens} tokens, {s.tok_per_s:.1f} tok/s, "
          f"mean acceptance length {s.mean_acceptance_length:.2f}", file=sys.stderr)
    return 0


def _generate_vllm(args, sampling) -> int:
    from .vllm_backend import VllmEngine

    with VllmEngine(args.model, args.method, args.k, args.draft, args.dtype, args.seed, args.cache_dir,
                    **_vllm_options(args)) as engine:
        out = engine.generate(args.prompt, args.max_new_tokens, sampling, args.seed)
    print(out.text)
    s = out.stats
    print(f"\n[vLLM {args.method} k={engine.k}] {s.num_output_tokens} tokens, {s.tok_per_s:.1f} tok/s, "
          f"mean acceptance length {s.mean_acceptance_length:.2f}", file=sys.stderr)
    return 0


def trainers() -> tuple[str, ...]:
    """`specdec train <method>`: one subcommand per method that has a trainer (methods.py), train/<method>.py."""
    return names(lambda m: m.trainer)


def _add_train_parser(sub, with_trainers: bool = True) -> None:
    """`specdec train data` and `specdec train <method>`: the flags every trainer shares, then its own
    (with_trainers=False: the methods are listed, their trainers not imported).

    Shared: --target --steps --budget-min --lr --out --threads --data-dir
    --work-dir --seed --eval-every --no-progress (defaults per method). A method's own
    flags (sizes, loss weights) live beside its loss, in its module's
    `add_arguments`; a flag that a method does not have is refused.
    """
    from importlib import import_module

    t = sub.add_parser("train", help="train a learned drafter on the target's own answers (CPU is enough)",
                       description="Build the dataset (`specdec train data`), then train a drafter on it.")
    methods = t.add_subparsers(dest="method", required=True, metavar="{data," + ",".join(trainers()) + "}")
    d = methods.add_parser("data", help="let the target answer the training prompts (the dataset every drafter reads)",
                           allow_abbrev=False)
    d.add_argument("--target", default="smollm2-135m", help="embedded name, local HF directory or hub id")
    d.add_argument("--dtype", choices=["bf16", "fp32", "fp16", "auto"], default="bf16",
                   help="the target's dtype (auto: what the device runs best)")
    d.add_argument("--device", default=None, help="cpu or cuda; default: GPU if present")
    d.add_argument("--data-dir", default=None, help="default: $SPECDEC_CACHE/data/<target>")
    d.add_argument("--budget-min", type=float, default=None, help="stop after this many minutes (run again to go on)")
    d.add_argument("--backend", choices=["native", "vllm"], default="native",
                   help="who generates: HF generate, or vLLM's batching (several times faster; needs vLLM)")
    d.add_argument("--temperature", type=float, default=0.0, help="0 = the greedy answer; > 0 = sampled answers")
    d.add_argument("--max-new-tokens", type=int, default=256)
    d.add_argument("--batch-size", type=int, default=None, help="prompts per batch (default 16 native, 128 vLLM)")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--no-progress", action="store_true", help="no progress bar")
    d.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="on an error, show the traceback")
    for method in trainers() if with_trainers else ():
        trainer = import_module(f".train.{method}", __package__)
        summary = trainer.__doc__.strip().splitlines()[0]
        p = methods.add_parser(method, help=summary, description=summary, allow_abbrev=False)  # no guessed flags
        _add_train_common(p, trainer.DEFAULTS)
        trainer.add_arguments(p)


def _add_train_common(p, defaults: dict) -> None:
    p.add_argument("--target", default="smollm2-135m", help="embedded name, local HF directory or hub id")
    p.add_argument("--steps", type=int, default=defaults["steps"], help="step budget, and the schedule's horizon")
    p.add_argument("--budget-min", type=float, default=None,
                   help="also stop after this many minutes of training (run again to continue)")
    p.add_argument("--lr", type=float, default=defaults["lr"], help="peak learning rate (warm-up, then cosine)")
    p.add_argument("--out", default=None, help="checkpoint folder (default: specdec_learn/checkpoints/<its name>)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own choice)")
    p.add_argument("--device", default="cpu",
                   help="cpu (the default), or cuda (CUDA and ROCm alike): the same recipe, in minutes, not hours")
    p.add_argument("--data-dir", default=None,
                   help="the dataset (default: the committed corpus, datasets/<target>/; else $SPECDEC_CACHE/data/<target>)")
    p.add_argument("--work-dir", default=None, help="the resumable state (default: $SPECDEC_CACHE/train/<its name>)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-every", type=int, default=None,
                   help="a held-out evaluation every N steps, for the learning curve in recipe.json (default: the "
                        "method's own; at least at the end)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars and no per-step log lines")
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="on an error, show the traceback")


def _train(args) -> int:
    if args.method == "data":
        return _train_data(args)
    from importlib import import_module

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device != "cpu":
        if not args.device.startswith("cuda") or not torch.cuda.is_available():
            raise ValueError(f"--device {args.device}: this torch sees no GPU (torch {torch.__version__}); "
                             "train with --device cpu, or install a CUDA or ROCm build of torch")
        # everything a trainer makes without naming a device (its drafter, its batches) is made there;
        # random draws stay on the CPU generator of train/loop.step_generator, so a run draws the same anywhere
        torch.set_default_device(args.device)
    trainer = import_module(f".train.{args.method}", __package__)
    try:
        out = trainer.cli(args, _train_command(args))
    except KeyboardInterrupt:  # the loop has saved its state and said where
        print("specdec: interrupted; the same command continues the run", file=sys.stderr)
        return 130
    print(f"{args.method} drafter written to {out} (its recipe.json records the run)")
    return 0


def _train_command(args) -> str:
    """The command that repeats this run, every flag spelled out with its value (defaults included)."""
    import shlex

    words = ["specdec", "train", args.method]
    for key, value in vars(args).items():
        if key in ("command", "method", "debug") or value is None or value is False:
            continue
        words += [f"--{key.replace('_', '-')}"] + ([] if value is True else [str(value)])
    return shlex.join(words)


def _train_data(args) -> int:
    """Answer the training prompts not yet answered (resumable), with the target or with vLLM."""
    from .train import data

    data_dir = args.data_dir or data.default_dir(args.target)
    if data.is_corpus(data_dir):
        from .train.corpus import read_manifest

        manifest = read_manifest(data_dir)  # it counts what its shards hold
        print(f"{args.target}'s training data is the committed corpus in {data_dir}: {manifest['examples']} "
              f"examples, {manifest['response_tokens']} response tokens. To add to it: "
              "python -m specdec_learn.train.corpus start (in an environment with vLLM); "
              "to write a separate JSONL dataset: --data-dir DIR.")
        return 0
    kwargs = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed,
                  budget_s=args.budget_min * 60 if args.budget_min else None, progress=not args.no_progress)
    if args.backend == "vllm":
        from .vllm_backend import VllmEngine

        with VllmEngine(args.target, method="ar", dtype=args.dtype, seed=args.seed) as engine:
            data.build_dataset(None, data_dir, data.training_prompts(), batch_size=args.batch_size or 128,
                               engine=engine, **kwargs)
    else:
        from .target import load

        target = load(args.target, dtype=args.dtype, device=args.device, invariant=False)  # whole answers, batched
        data.build_dataset(target, data_dir, data.training_prompts(), batch_size=args.batch_size or 16, **kwargs)
    examples = data.load_examples(data_dir)
    tokens = sum(sum(ex.loss_mask) for ex in examples)
    print(f"{data_dir}: {len(examples)} examples, {tokens} response tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
