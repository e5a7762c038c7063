"""The synthetic pool (`synth`) and pool-demo's whole screen on this machine: an embedded Redis, simulated
servers, one worker each, watched to the end (`run`)."""
