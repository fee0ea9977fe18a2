"""The service itself: health, the flags the SDK asks for first, telemetry, capabilities, and
one 404 for every path this server does not serve (``fallback``, routed last)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from omnigym.serve.routes.context import served

NOT_SUPPORTED = ("/api/v1/create_custom_loss", "/api/v1/save_weights_external", "/api/v1/copy_weights",
                 "/api/v1/join_sampling_session", "/api/v1/forward", "/api/v1/weights_info",
                 "/api/v1/retrieve_futures", "/api/v1/cancel_future", "/api/v1/auth/token")
"""paths the SDK can call that this server answers with a 404 "not supported" (docs/serve.md)"""

router = APIRouter()
fallback = APIRouter()


@router.get("/api/v1/healthz")
async def healthz():
    return {"status": "ok"}


@router.post("/api/v1/client/config")
async def client_config(request: Request):
    # Flags that keep the protocol to what this server speaks: API-key auth, uncompressed
    # protobuf forward_backward chunks sent one after another, per-request future polling,
    # custom losses computed by the client.
    limits = served(request).limits
    return {"pjwt_auth_enabled": False, "proto_compress_fwdbwd": False, "parallel_fwdbwd_chunks": False,
            "sample_use_retrieve_futures": False, "custom_loss_server_side": False,
            "sample_join_sampling_session": False, "use_pyqwest_transport": False,
            "fwdbwd_max_chunk_len": limits.max_data,
            "fwdbwd_max_chunk_bytes_count": max(1, limits.max_request_bytes // 2)}


@router.post("/api/v1/telemetry")
async def telemetry(request: Request):
    await served(request).read(request)  # the SDK's usage events: not kept
    return {"status": "accepted"}


@router.get("/api/v1/get_server_capabilities")
async def capabilities(request: Request):
    hub = served(request).hub
    return {"supported_models": [{"model_name": hub.base_model, "max_context_length": hub.max_length,
                                  "trainable": True, "sampleable": True}]}


@fallback.api_route("/api/v1/{rest:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"])
async def not_supported(rest: str):
    # 404, not 501: the SDK retries 5xx for minutes, a 404 it raises at once with this text
    known = f"/api/v1/{rest}" in NOT_SUPPORTED
    what = "is not supported by omnigym serve" if known else "is not an endpoint of omnigym serve"
    return JSONResponse({"detail": f"/api/v1/{rest[:80]} {what} (docs/serve.md lists what is)"}, status_code=404)
