"""fab teardown: stop the services, remove what deploy put on the hosts, verify, release, forget.

Safe to run twice: with nothing provisioned it says so and succeeds.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable

from provision import firewall, hosts, inventory, targets
from provision import state as state_module
from provision.ansible import PlaybookError, run_playbook
from provision.deploy import bundle_dir, extravars
from provision.errors import OperationError


class TeardownError(OperationError):
    pass


def teardown(
    settings: dict,
    state: state_module.State | None,
    say: Callable[[str], None] = print,
    purge: bool = False,
    release_lease: bool = False,
) -> None:
    """release_lease: a lease the user brought (provision --lease) is deleted too, not left."""
    if state is None:
        say("nothing is provisioned: nothing to tear down")
        inventory.remove()
        return
    if state.hosts and state.deploy:
        say(f"stopping services and removing the deployment on {len(state.hosts)} host(s)")
        try:
            # Every opening the deploys recorded is closed, whatever the settings say now.
            closing = {"lab_firewall_open": {}, "lab_firewall_close": firewall.recorded(state)}
            run_playbook("teardown.yml", extravars(settings, state) | closing, say)
        except PlaybookError as error:
            if not purge and not targets.release_deletes_hosts(state.target):
                raise TeardownError(
                    f"{error}\n\nthe state is kept: fix the problem and run `fab teardown` again, "
                    "or `fab teardown --purge` to forget these hosts without cleaning them"
                ) from None
            # A node that release deletes goes with everything on it; --purge means the user said so.
            say(f"warning: could not clean the hosts ({str(error).splitlines()[0]}); continuing")
        state.deploy = {}
        state.record("services stopped, deployment removed and verified gone")
        state_module.save(state)

    def save(updated: state_module.State) -> None:
        state_module.save(updated)

    # Addresses that go back to the cloud's pool: the next node behind one has another key.
    released = [(host.address, host.port) for host in state.hosts] if targets.release_deletes_hosts(state.target) else []
    try:
        targets.release(state.target, state, settings, save, say, {"release_lease": release_lease})
    except Exception as error:
        if not purge:
            raise TeardownError(
                f"could not release the {state.target} resources: {error}\n"
                "the state is kept: run `fab teardown` again, or `fab teardown --purge` to forget them locally "
                "(they may still exist in the cloud)"
            ) from error
        say(f"warning: {error}; forgetting the local state as --purge asks")
    for address, port in released:
        if hosts.forget_host_key(address, port):
            say(f"forgot the host key of {address} (the address went back to the cloud)")
    state_module.clear()
    inventory.remove()
    shutil.rmtree(bundle_dir(), ignore_errors=True)
    say("teardown complete: nothing of ours is running, state cleared")
