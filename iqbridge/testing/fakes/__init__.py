"""In-process fakes of broker client libraries that cannot run on the build machines.

Each module here imitates the part of one client library's API that an iqbridge adapter
calls, written from that library's own code and its vendor's documentation, with the
semantics and the documented error codes the adapter relies on. A test puts the fake in
``sys.modules`` under the client's name (the adapters import their client lazily), so the
adapter runs unchanged: it never holds a branch for a fake. The live suites run the same
tests against the real servers under Docker.
"""
