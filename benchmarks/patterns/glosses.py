"""English glosses of the seeds' Chinese section names, shown after each name in the report."""

from __future__ import annotations

import re

GLOSS = {
    "Agent 状态栏在上下文中的具体位置": "where the status bar sits in the context",
    "KV Cache 友好的上下文设计": "KV-cache-friendly context design",
    "KV Cache 未必是一次性的": "the KV cache need not be single-use",
    "KV Cache 的原理与约束": "how the KV cache works and what it constrains",
    "Skills 的实现方式与权衡": "ways to deliver skills and their trade-offs",
    "Skills（第一层元数据）": "skills (level 1: metadata)",
    "Subagent 的系统提示词": "the sub-agent's system prompt",
    "Token 是什么": "what a token is",
    "上下文全景": "the whole context at a glance",
    "为什么 Agent 仍可能“忘记”": "why an agent may still 'forget'",
    "为什么要缓存": "why cache",
    "为什么需要压缩": "why compress",
    "从读数到策略：Agent 的物理时间感知": "from readings to strategy: an agent's sense of time",
    "前缀匹配": "prefix matching",
    "已有的内容只追加不修改": "existing content is only appended to, never modified",
    "压缩与 KV Cache": "compression and the KV cache",
    "生产级的分层压缩机制": "production-grade layered compression",
    "压缩怎样工作": "how compaction works",
    "压缩策略的设计原则": "design principles of compression",
    "实验 2-3 常见的错误上下文管理模式": "Experiment 2-3: common context-management mistakes",
    "对 Agent 架构设计的启示": "lessons for agent architecture",
    "工具定义": "tool definitions",
    "延迟工具列表": "the deferred tool list",
    "换轮时哪些内容会延续": "what carries over from turn to turn",
    "模型请求怎样组装": "how a model request is assembled",
    "状态更新的两种实现与缓存代价": "two ways to update the status and their cache cost",
    "缓存作为架构约束": "the cache as an architectural constraint",
    "能力开关与缓存": "capability toggles and the cache",
    "隔离优于压缩：子 Agent 上下文隔离": "isolation beats compression: sub-agent context isolation",
    "静态与动态的分离": "separating the static from the dynamic",
    "压缩与 KV Cache / 生产级的分层压缩机制": "compression and the KV cache / production-grade layered compression",
}
_NAMES = re.compile("|".join(re.escape(n) for n in sorted(GLOSS, key=len, reverse=True)))


def gloss(source: str) -> str:
    """``source`` with an English gloss after each Chinese section name (one pass, longest name first,
    so a name containing another is glossed once)."""
    return _NAMES.sub(
        lambda m: m.group(0) if m.group(0) == GLOSS[m.group(0)] else f"{m.group(0)} ({GLOSS[m.group(0)]})",
        source,
    )
