"""What the tests share, imported as `support.<module>` (tests/ is on the tests' path):

lab               Lab: an isolated user of `fab` (own state file, deploy folders, results, free ports)
serving           clients of a served model and the API; a short real bench run
repository        the model repository rendered as the tests' server has it
observing         what a test reads off a run: its output lines, changed tasks, what Triton serves
states            states with made-up hosts, for the plans (cluster, firewall)
sshd              a real sshd on 127.0.0.1
fake_openstack    Chameleon's APIs (Keystone, Blazar, Nova, Neutron, Glance) for the real python-chi
cluster_nodes     containers that stand for cluster nodes, with sshd and firewalld
trained_mobilenet trained MobileNetV2 weights made from a published model (no model hub)

conftest.py holds the fixtures only; no test imports it.
"""
