"""Helpers shared by the test folders: throwaway Redis servers, ledgers of each backend, worker
processes, request bodies and replayed wire answers."""
