# Magnetar's entry points. Everything goes through CMake; this file only names the common jobs.
#   make demo      install deps, build, run the main job on the bundled default
#   make test      install deps, build, run every test suite (what CI runs)
#   make test-asan the GGUF, quant and conformance suites under AddressSanitizer + UBSan (CI runs it too)
#   make bench     build and run the kernel, CPU attention and sampler microbenchmarks
#   make lint      clang-format check + clang-tidy on the sources
#   make fuzz      libFuzzer run of the GGUF parser (clang++), FUZZ_SECONDS long
JOBS ?= 2
BUILD ?= build
CMAKE_FLAGS ?=
FUZZ_SECONDS ?= 60
DEMO_MODEL ?= models/magnetar-demo-q8_0.gguf
DEMO_CHAT = Who are you?\nWhat does the word "light" mean?\nQuote Genesis 1:1.\nWhat does os.getcwd() do in Python?\nTell me a fortune.\n
ASAN_SUITES = magnetar_gguf_tests magnetar_quant_tests magnetar_conformance_tests
space := $(subst ,, )
# A new build folder gets Ninja (scripts/setup.sh installs it; it schedules the 2-core box better than make's
# recursive build: ~45 s of make test's build); an existing folder keeps the generator it was made with.
generator = $(if $(wildcard $(1)/CMakeCache.txt),,-G Ninja)

.PHONY: all deps build demo test test-asan bench lint format fuzz clean

all: build

deps:
	@bash scripts/setup.sh

build: deps
	@cmake -S . -B $(BUILD) $(call generator,$(BUILD)) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

demo: build
	$(BUILD)/tools/magnetar inspect $(DEMO_MODEL)
	$(BUILD)/tools/magnetar run -m $(DEMO_MODEL) -p "The strlen() function" -n 80 --temp 0 --echo
	@echo
	printf '$(DEMO_CHAT)' | $(BUILD)/tools/magnetar chat -m $(DEMO_MODEL) --no-think --temp 0

test: build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 600

test-asan: deps
	@cmake -S . -B $(BUILD)-asan $(call generator,$(BUILD)-asan) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMAGNETAR_SANITIZE=address,undefined \
	  -DMAGNETAR_CUDA=OFF -DMAGNETAR_BENCH=OFF >/dev/null
	@cmake --build $(BUILD)-asan -j $(JOBS) --target $(ASAN_SUITES)
	@cd $(BUILD)-asan && ctest --output-on-failure -j $(JOBS) -L '$(subst $(space),|,$(ASAN_SUITES))' --timeout 600

bench: build
	$(BUILD)/bench/magnetar_bench_quant --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
	$(BUILD)/bench/magnetar_bench_sampling --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
	$(BUILD)/bench/magnetar_bench_cpu_attention --benchmark_repetitions=5 --benchmark_report_aggregates_only=true

lint: deps build
	@bash scripts/lint.sh $(BUILD)

format:
	@git ls-files '*.cpp' '*.h' '*.cu' '*.cuh' | xargs clang-format -i

fuzz:
	@bash scripts/setup.sh fuzz
	@cmake -S . -B $(BUILD)-fuzz $(call generator,$(BUILD)-fuzz) -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang -DMAGNETAR_FUZZ=ON -DMAGNETAR_SANITIZE=fuzzer-no-link,address,undefined \
	  -DMAGNETAR_CUDA=OFF -DMAGNETAR_TESTS=OFF -DMAGNETAR_BENCH=OFF >/dev/null
	@cmake --build $(BUILD)-fuzz -j $(JOBS) --target magnetar_fuzz_gguf
	@mkdir -p $(BUILD)-fuzz/corpus
	$(BUILD)-fuzz/tests/fuzz/magnetar_fuzz_gguf -max_total_time=$(FUZZ_SECONDS) $(BUILD)-fuzz/corpus

clean:
	rm -rf $(BUILD) $(BUILD)-asan $(BUILD)-fuzz
