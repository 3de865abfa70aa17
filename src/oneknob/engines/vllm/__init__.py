"""vLLM as oneknob drives it. Each module runs in one interpreter, and its folder says which:

oneknob's interpreter (the planner and the commands; vLLM is never imported here):
    facts.py        `VllmFacts`: defaults, tokenizer, versions, the build a job asks for, pre-flight checks, the
                    predicted resolved config
    validate.py     vLLM's own check of a plan: runs standalone/introspect.py in the job build's interpreter
    build_facts.py  a job's build as a plan sees it (its release, a kept copy of it, the runner it runs)
    commit.py       vllm.commit's interpreter (a commit's files over its nearest release)
    contract.py     every vLLM name oneknob uses, checked against a release's sources (`python -m oneknob
                    vllm-contract`); fit.py: each study fitted to a release; release.py: what a release is, read
                    from it; sources.py: a release's sources read with `ast`; wheels.py: the wheels kept to read
The worker's interpreter (the job's build: its vLLM is imported there):
    engine.py       `VllmEngine`: one `LLM(...)` per job, through vLLM's offline API
    server.py       `vllm serve` in its own process group, over HTTP (its facts and its engine)
vLLM's own processes (loaded through the `vllm.general_plugins` entry point, pyproject.toml):
    plugin.py       reads the resolved config back, records the steps, starts the emulation
    graph_pool.py   the CUDA-graph output pool of vLLM #53520, emulated on vLLM's CPU build
standalone/: the standard library and vLLM only, never oneknob (import-linter says so): scripts a build's
    interpreter runs with `python -P` (introspect.py, command.py, release_probe.py), and versions.py, the table
    of where vLLM moved between releases, which every interpreter reads (the scripts load it by file).
"""
