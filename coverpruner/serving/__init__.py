"""coverpruner.serving: an OpenAI-compatible HTTP server over ``Pipeline`` (FastAPI + uvicorn), and the
same app on Ray Serve for scale-out. Needs the ``serve`` extra (``serve-ray`` for Ray).

    from coverpruner.serving import ServerConfig, create_app
    app = create_app(ServerConfig("engine-dir", workers=2))   # any ASGI server runs it

CLI: ``coverpruner-serve ENGINE_DIR`` (see serving/cli.py, docs/serving.md).
"""

from coverpruner.serving.app import ServerConfig, create_app

__all__ = ["ServerConfig", "create_app"]
