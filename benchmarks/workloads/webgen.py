"""Plausible tool output for a research agent: search result lists and fetched articles."""

from __future__ import annotations

import random

SITES = [
    ("docs.vllm.ai", "vLLM documentation"),
    ("lmsys.org", "LMSYS blog"),
    ("arxiv.org", "arXiv"),
    ("github.com", "GitHub"),
    ("huggingface.co", "Hugging Face blog"),
    ("docs.anthropic.com", "Anthropic docs"),
    ("platform.openai.com", "OpenAI platform docs"),
    ("news.ycombinator.com", "Hacker News"),
    ("medium.com", "Medium"),
]
SYSTEMS = ["vLLM", "SGLang", "llama.cpp", "TensorRT-LLM", "TGI", "LMDeploy"]
FEATURES = [
    "automatic prefix caching",
    "RadixAttention",
    "paged attention",
    "chunked prefill",
    "prompt caching",
    "KV cache offloading",
    "speculative decoding",
]
MODELS = ["Llama-3.1-8B", "Qwen2.5-7B", "Mistral-7B", "Llama-3.1-70B", "Qwen3-32B"]
GPUS = ["A100 80GB", "H100 SXM", "L40S", "RTX 4090"]

_SENTENCES = [
    "{system} implements {feature} by hashing each block of {block} tokens together with the hash of its prefix.",
    "In our measurements on a {gpu} with {model}, {feature} cut time to first token from {a} ms to {b} ms "
    "for prompts sharing a {n}-token prefix.",
    "The cache hit rate on the multi-turn chat trace was {pct}%, against {pct2}% for the few-shot benchmark.",
    "{system} evicts cached blocks with an LRU policy once GPU memory utilisation exceeds {util}%.",
    "A single changed token invalidates every cached block after it, which is why dynamic content such as "
    "timestamps should be placed at the end of the prompt.",
    "Version {ver} added support for sharing cached prefixes between requests with different sampling settings.",
    "Throughput rose by {x}x on the agent workload, where {pct}% of prompt tokens were repeated from earlier calls.",
    "Hosted APIs bill cached input tokens at {disc}% of the normal price and require a minimum prefix of "
    "{minp} tokens before caching applies.",
    "The authors note that reordering tool definitions between calls reduced the hit rate to {pct3}%.",
    "Cached entries expire after {ttl} minutes without use; each hit refreshes the timer.",
    "With {feature} disabled, prefill dominated end-to-end latency beyond {n} tokens of context.",
    "{system} exposes the number of cached prompt tokens in the usage field of each response.",
]


def _fill(rng: random.Random, template: str) -> str:
    a = rng.randint(300, 2400)
    return template.format(
        system=rng.choice(SYSTEMS),
        feature=rng.choice(FEATURES),
        block=rng.choice([16, 32, 64, 256]),
        gpu=rng.choice(GPUS),
        model=rng.choice(MODELS),
        a=a,
        b=rng.randint(40, a // 3),
        n=rng.choice([1024, 2048, 4096, 8192, 16384]),
        pct=rng.randint(55, 97),
        pct2=rng.randint(10, 60),
        pct3=rng.randint(2, 30),
        util=rng.choice([80, 90, 95]),
        ver=f"0.{rng.randint(3, 9)}.{rng.randint(0, 6)}",
        x=round(rng.uniform(1.3, 5.2), 1),
        disc=rng.choice([10, 25, 50]),
        minp=rng.choice([1024, 2048]),
        ttl=rng.choice([5, 10, 60]),
    )


def _url(rng: random.Random, site: str, topic: str) -> str:
    slug = "-".join(topic.lower().split()[:5]).replace(",", "")
    return f"https://{site}/{rng.choice(['blog', 'docs', 'posts', 'abs'])}/{slug}-{rng.randint(100, 9999)}"


def search_results(rng: random.Random, query: str, n: int) -> tuple[str, list[str]]:
    """A numbered result list as web_search returns it, and the URLs it lists."""
    rows, urls = [], []
    for i in range(n):
        site, label = rng.choice(SITES)
        topic = f"{rng.choice(SYSTEMS)} {rng.choice(FEATURES)} {rng.choice(['explained', 'benchmark', 'design', 'release notes', 'deep dive'])}"
        url = _url(rng, site, topic)
        urls.append(url)
        date = f"202{rng.randint(3, 5)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
        snippet = " ".join(_fill(rng, rng.choice(_SENTENCES)) for _ in range(2))
        rows.append(f"{i + 1}. {topic.title()} | {label}\n   {url} ({date})\n   {snippet}")
    return f'Results for "{query}":\n\n' + "\n\n".join(rows), urls


def article(rng: random.Random, url: str, n_paragraphs: int) -> str:
    """The main text of a fetched page as Markdown: title, sections, paragraphs, a small table."""
    system, feature = rng.choice(SYSTEMS), rng.choice(FEATURES)
    parts = [f"# {feature.capitalize()} in {system}: what we measured", f"Source: {url}", ""]
    for p in range(n_paragraphs):
        if p % 3 == 0:
            parts.append(f"## {rng.choice(['Design', 'Setup', 'Results', 'Limitations', 'Discussion'])}")
        parts.append(" ".join(_fill(rng, rng.choice(_SENTENCES)) for _ in range(rng.randint(3, 5))))
        parts.append("")
    parts.append("| model | GPU | prefix tokens | TTFT cold (ms) | TTFT cached (ms) |")
    parts.append("|---|---|---|---|---|")
    for _ in range(4):
        cold = rng.randint(200, 3000)
        parts.append(
            f"| {rng.choice(MODELS)} | {rng.choice(GPUS)} | {rng.choice([2048, 4096, 8192])} | {cold} | {rng.randint(20, cold // 4)} |"
        )
    return "\n".join(parts)


def note_id(rng: random.Random) -> str:
    return f"note_{rng.randint(1000, 9999)}"


def finding(rng: random.Random) -> str:
    return _fill(rng, rng.choice(_SENTENCES))
