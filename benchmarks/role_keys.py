"""Role maps across families: how much of a family that training never saw gets a role map of
its own, with roles keyed by name (`train-ghn --role-key name`, the default) or by leaf
(`--role-key leaf`), and with only the most frequent roles mapped (`--max-roles`).

    .venv/bin/python benchmarks/role_keys.py          # print the table
    .venv/bin/python benchmarks/role_keys.py --write  # update BENCHMARKS.md

Sixteen families, each shrunk to two blocks (Swin: one per stage) and traced on meta in a few
seconds: ten transformers decoders and six timm ViTs. Each row holds one family out and counts
its parameter tensors whose role the other fifteen have, so that a hypernetwork trained on them
would decode those tensors through a role map; the rest fall back to the shared map. Coverage
says which tensors find a map, not that the map fits them: a leaf name means the same thing in
most families (q_proj, fc1), but not always (timm's `proj` is an attention output and a patch
embedding).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

import graphkit  # noqa: E402
from graphkit.ghn.encoding import frequent_roles, role_of, targets  # noqa: E402

GQA = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
#: transformers decoders: (model class, config class prefix, sizes)
DECODERS = {
    "gpt2": ("GPT2LMHeadModel", "GPT2", dict(n_layer=2, n_embd=64, n_head=4)),
    "gptj": ("GPTJForCausalLM", "GPTJ", dict(n_layer=2, n_embd=64, n_head=4, rotary_dim=8)),
    "gpt_neox": ("GPTNeoXForCausalLM", "GPTNeoX", dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4)),
    "opt": ("OPTForCausalLM", "OPT", dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, ffn_dim=128)),
    "llama": ("LlamaForCausalLM", "Llama", dict(GQA)),
    "mistral": ("MistralForCausalLM", "Mistral", dict(GQA)),
    "qwen2": ("Qwen2ForCausalLM", "Qwen2", dict(GQA)),
    "phi": ("PhiForCausalLM", "Phi", dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4)),
    "gemma": ("GemmaForCausalLM", "Gemma", dict(GQA)),
    "falcon": ("FalconForCausalLM", "Falcon", dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4)),
}
#: timm ViTs: (model name, the keyword that makes them shallow)
VITS = {
    "vit": ("vit_tiny_patch16_224", dict(depth=2)),
    "deit3": ("deit3_small_patch16_224", dict(depth=2)),
    "swin": ("swin_tiny_patch4_window7_224", dict(depths=(1, 1, 1, 1))),
    "beit": ("beit_base_patch16_224", dict(depth=2)),
    "eva02": ("eva02_tiny_patch14_224", dict(depth=2)),
    "cait": ("cait_xxs24_224", dict(depth=2)),
}
#: the --max-roles of the last column
TOP = 32


def graphs() -> dict[str, graphkit.ArchGraph]:
    """Every family's small model, traced."""
    import timm
    import transformers

    transformers.logging.set_verbosity_error()  # small vocabularies: the config's token-id notes
    out = {}
    for family, (model, prefix, sizes) in DECODERS.items():
        config = getattr(transformers, prefix + "Config")(
            vocab_size=128, intermediate_size=128, bos_token_id=0, eos_token_id=0, **sizes
        )
        with torch.device("meta"):
            out[family] = graphkit.trace(getattr(transformers, model)(config))
    for family, (name, depth) in VITS.items():
        with torch.device("meta"):
            out[family] = graphkit.trace(timm.create_model(name, pretrained=False, num_classes=10, **depth))
    return out


def table(args) -> str:
    import timm
    import transformers

    traced = graphs()
    rows = [
        f"| held-out family | parameter tensors | with a role map, by name | by leaf | by leaf, --max-roles {TOP} |",
        "|---|---|---|---|---|",
    ]
    totals = [0, 0, 0, 0]
    for family, graph in traced.items():
        others = [g for f, g in traced.items() if f != family]
        names = [t.name for t in targets(graph)]
        found = [
            sum(role_of(n, key) in set(frequent_roles(others, key, limit)) for n in names)
            for key, limit in (("name", None), ("leaf", None), ("leaf", TOP))
        ]
        totals = [a + b for a, b in zip(totals, [len(names), *found])]
        rows.append(f"| {family} | {len(names)} | " + " | ".join(f"{n / len(names):.0%}" for n in found) + " |")
    rows.append(f"| all | {totals[0]} | " + " | ".join(f"{n / totals[0]:.0%}" for n in totals[1:]) + " |")
    roles = {key: frequent_roles(traced.values(), key) for key in ("name", "leaf")}
    shared = {
        key: sum(sum(r in set(frequent_roles([g], key)) for g in traced.values()) >= 2 for r in every)
        for key, every in roles.items()
    }
    head = (
        f"Measured {time.strftime('%Y-%m-%d')} with transformers {transformers.__version__} and timm "
        f"{timm.__version__}; {len(traced)} families. Roles in the pool: "
        f"{len(roles['name'])} by name ({shared['name']} in two families or more), "
        f"{len(roles['leaf'])} by leaf ({shared['leaf']}). Command: `.venv/bin/python benchmarks/role_keys.py --write`."
    )
    text = head + "\n\n" + "\n".join(rows) + "\n"
    print(text)
    return text


def main() -> None:
    common.main(__doc__, "role_keys", table)


if __name__ == "__main__":
    main()
