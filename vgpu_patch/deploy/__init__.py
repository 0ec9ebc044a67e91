"""Deploy, status and rollback of the shim on nodes: facts (read-only probes), the swap protocol, fleets.

The on-node layout is the contract in docs/node-state.md, shared with the Ansible role and the node agent.
"""
