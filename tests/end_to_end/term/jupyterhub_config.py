# The term's JupyterHub (tests/end_to_end/term/machine.py starts it, as root, with
# `python -m jupyterhub -f THIS_FILE`): every address on 127.0.0.1, its state in the scenario's
# temporary folder, the learners and the instructor as local users logging in with one shared
# password, each server started by LocalProcessSpawner as that user.
import json
import os

s = json.load(open(os.environ["ATTENTION_TERM_HUB"], encoding="utf-8"))
state = s["dir"]
c = get_config()  # noqa: F821 - given by traitlets when it loads this file

c.JupyterHub.bind_url = f"http://127.0.0.1:{s['port']}"
c.JupyterHub.hub_bind_url = f"http://127.0.0.1:{s['hub_port']}"
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{s['api_port']}"
c.ConfigurableHTTPProxy.command = [s["proxy"]]
c.ConfigurableHTTPProxy.pid_file = os.path.join(state, "jupyterhub-proxy.pid")
c.JupyterHub.db_url = "sqlite:///" + os.path.join(state, "jupyterhub.sqlite")
c.JupyterHub.cookie_secret_file = os.path.join(state, "jupyterhub_cookie_secret")
c.JupyterHub.pid_file = os.path.join(state, "jupyterhub.pid")
c.JupyterHub.cleanup_servers = True  # the hub stops every server it started when it stops
c.JupyterHub.cleanup_proxy = True

c.JupyterHub.authenticator_class = "shared-password"
c.SharedPasswordAuthenticator.user_password = s["password"]
c.Authenticator.allowed_users = set(s["users"])

c.JupyterHub.spawner_class = "localprocess"
c.Spawner.cmd = [os.path.join(s["venv_bin"], "jupyterhub-singleuser")]
c.Spawner.default_url = "/lab"
c.Spawner.environment = {"OMP_NUM_THREADS": "1"}
c.Spawner.start_timeout = 180
c.Spawner.http_timeout = 180
