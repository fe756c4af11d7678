"""What every Airflow process pays for the project's plugin: a task process loads it cheaply, the API server gets the app.

Airflow's plugin manager runs in every process it starts, each task's included (``get_template_context`` calls
``integrate_macros_plugins``), and executes every ``.py`` file of the plugins folder as a module of its own.
Before, that imported the status view's FastAPI app and the API server's security modules (~550 modules, ~1 s of
CPU) in every task of every cutover, and registered each package file a second time under its bare name
(``operators``, ``app``, ...). Checked on Airflow's own plugin manager in a fresh interpreter, as a task sees it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from tests.dags.airflow_harness import PLUGINS_FOLDER

#: File names of the plugin packages: the plugin manager would register each as a top-level module of that name.
PACKAGE_FILES = sorted({p.stem for p in PLUGINS_FOLDER.glob("nexus_*/*.py")} - {"__init__"})


def load_plugins_as(process: str) -> dict:
    """In a fresh interpreter: load the plugins as a task process does, then (``api_server``) read the FastAPI ones."""
    code = textwrap.dedent(
        f"""
        import json, sys, time
        import airflow.sdk.execution_time.task_runner  # what a task process has imported before it loads plugins
        from airflow.sdk import plugins_manager
        before = set(sys.modules)
        cpu = time.process_time()
        plugins_manager.integrate_macros_plugins()
        plugins, errors = plugins_manager._get_plugins()
        out = {{"plugins": [p.name for p in plugins], "errors": errors, "cpu_s": time.process_time() - cpu,
                "new_modules": sorted(set(sys.modules) - before)}}
        if {process!r} == "api_server":
            from airflow import plugins_manager as core
            apps, middlewares = core.get_fastapi_plugins()
            out["apps"] = [(a["url_prefix"], type(a["app"]).__name__, a["name"]) for a in apps]
            out["middlewares"] = [m["middleware"].__module__ + "." + m["middleware"].__name__ for m in middlewares]
            out["routes"] = sorted(r.path for a in apps for r in a["app"].routes)
        print(json.dumps(out))
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_task_process_loads_the_plugin_without_the_status_view_or_a_second_copy_of_the_packages():
    loaded = load_plugins_as("task")
    print(f"plugin load in a task process: {loaded['cpu_s'] * 1000:.0f} ms CPU, {len(loaded['new_modules'])} modules")
    assert loaded["plugins"] == ["nexus_status"] and loaded["errors"] == {}
    heavy = [m for m in loaded["new_modules"] if m.split(".")[0] in ("fastapi", "starlette") or m.startswith(
        ("airflow.api_fastapi", "nexus_status."))]
    assert heavy == [], f"a task process imported the status view's web stack: {heavy[:8]}"
    twice = [m for m in loaded["new_modules"] if m in PACKAGE_FILES]
    assert twice == [], f"plugin files run as modules of their own (plugins/.airflowignore): {twice}"


def test_the_api_server_still_gets_the_status_view_and_the_form_middleware():
    served = load_plugins_as("api_server")
    assert served["apps"] == [["/nexus-status", "FastAPI", "Nexus tenant status"]]
    assert served["middlewares"] == ["nexus_status.form_errors.ReadableFormErrors"]
    assert {"/", "/rollouts", "/api/tenants", "/api/rollouts", "/api/rollouts/preflight.csv"} <= set(served["routes"])
