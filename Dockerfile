# Placeholder: one image for every function, completed with the manifests.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY shared ./shared
COPY functions ./functions
RUN pip install --no-cache-dir .
USER 65532:65532
ENTRYPOINT ["jobfence"]
