# One image for every lenserve service; docker-compose.yml picks the command per service.
FROM python:3.11-slim
WORKDIR /app
ENV PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# torch first, pinned: any looser torch requirement would pull a different build.
RUN pip install --no-cache-dir torch==2.13.0
COPY pyproject.toml README.md ./
COPY lenserve ./lenserve
COPY lenserve_contract ./lenserve_contract
COPY services ./services
COPY gateway ./gateway
COPY protos ./protos
RUN pip install --no-cache-dir .
ENTRYPOINT ["lenserve"]
