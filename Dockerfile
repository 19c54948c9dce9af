# Image of the reference application: the same image runs the API, the workers and the migrations.
# The library is installed like a user would (with the app's extra, and PostgreSQL's: compose.yaml
# uses postgresql+asyncpg), then its source is removed so only the installed copy runs; app/ is
# not in the wheel: it runs from /srv, put on PYTHONPATH.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONPATH=/srv

WORKDIR /srv
COPY pyproject.toml README.md ./
COPY agent_async ./agent_async
COPY app ./app
RUN pip install '.[app,postgres]' \
    && rm -rf agent_async build ./*.egg-info \
    && useradd --system --home-dir /srv --shell /usr/sbin/nologin agent \
    && mkdir -p /srv/data && chown agent /srv/data
USER agent

EXPOSE 8000
CMD ["hypercorn", "--config", "python:app.hypercorn_config", "app.asgi:app", "--bind", "0.0.0.0:8000"]
