"""The `shoal server` command: flags, the config file, clean shutdown on SIGTERM."""

import subprocess

from conftest import connect
from shoal_process import REPO, ShoalNode, free_port, shoal_binary


def test_listen_address_port_and_config_file(tmp_path):
    config = tmp_path / "shoal.toml"
    config.write_text('cluster_name = "Test Cluster"\ncommitlog_sync = "group"\n')
    node = ShoalNode(tmp_path / "node", address="127.0.0.7", port=free_port("127.0.0.7"), config=config)
    with node:
        cluster, session = connect(node)
        row = session.execute("SELECT cluster_name, rpc_address FROM system.local").one()
        assert row.cluster_name == "Test Cluster"
        assert row.rpc_address == "127.0.0.7"
        cluster.shutdown()
        assert node.stop() == 0
        assert "Shoal node stopped" in node.log()


def test_shipped_config_file_starts_a_node(tmp_path):
    node = ShoalNode(tmp_path / "node", config=REPO / "conf" / "shoal.toml")
    with node:
        cluster, session = connect(node)
        assert session.execute("SELECT key FROM system.local").one().key == "local"
        cluster.shutdown()


def test_bad_configuration_is_a_clear_error(tmp_path):
    config = tmp_path / "bad.toml"
    config.write_text("commitlog_sync_period_ms = 0\n")
    result = subprocess.run(
        [shoal_binary(), "server", "--config", str(config), "--data-dir", str(tmp_path / "d")],
        capture_output=True, text=True, timeout=30,
    )
    assert result.returncode != 0
    assert "commitlog_sync_period_ms" in result.stderr
    result = subprocess.run(
        [shoal_binary(), "server", "--commitlog-sync", "sometimes", "--data-dir", str(tmp_path / "d")],
        capture_output=True, text=True, timeout=30,
    )
    assert result.returncode != 0 and "sometimes" in result.stderr
