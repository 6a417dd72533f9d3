"""The paper's benchmarks on this machine (`python -m paper_repro.repro`) and by simulation."""
