"""OpenAI's ``GET /v1/models`` and ``GET /v1/models/{id}`` objects."""

from __future__ import annotations

from typing import Any

from kvreuse.runtime.server.state import ServerState


def model_card(state: ServerState) -> dict[str, Any]:
    return {
        "id": state.config.served_model_name, "object": "model", "created": state.created, "owned_by": "kvreuse",
        "max_model_len": state.engine.max_model_len,
    }  # fmt: skip


def model_list(state: ServerState) -> dict[str, Any]:
    return {"object": "list", "data": [model_card(state)]}


def model_lookup(state: ServerState, model_id: str) -> dict[str, Any]:
    state.check_model(model_id)  # unknown: a 404 (not_found_error)
    return model_card(state)
