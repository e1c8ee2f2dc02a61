"""Home Assistant's side of the ESPHome API, for Tests/BatonProxyTests/AioesphomeapiTests.swift.

aioesphomeapi (pinned in scripts/esphome-venv) connects to the gateway's ESPHome API server the
way Home Assistant's ESPHome integration does: hello (and the Noise handshake when a key is
given), device info, a subscription to raw advertisements and to the scanner state. Prints one
JSON line per step on stdout; the Swift test reads them after the process exits.

    esphome_client.py PORT KEY|- ADVERTISEMENTS [active]

With `active` it then asks for active scanning, as Home Assistant does for a window, takes as
many advertisements again once the scanner says it is active, and asks for passive again.
"""
import asyncio
import json
import sys

from aioesphomeapi import APIClient
from aioesphomeapi.model import BluetoothScannerMode


def say(**kw):
    print(json.dumps(kw), flush=True)


async def main() -> None:
    port, key, want = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    active = len(sys.argv) > 4 and sys.argv[4] == "active"
    client = APIClient("127.0.0.1", port, None, noise_psk=None if key == "-" else key,
                       client_info="baton-test", keepalive=60)
    try:
        await asyncio.wait_for(client.connect(login=False), 15)
    except Exception as e:  # noqa: BLE001 - the test asserts on the class name
        say(error=type(e).__name__, message=str(e))
        return
    say(api_version=[client.api_version.major, client.api_version.minor])
    info = await client.device_info()
    say(device_info={
        "name": info.name, "mac_address": info.mac_address, "esphome_version": info.esphome_version,
        "model": info.model, "manufacturer": info.manufacturer, "friendly_name": info.friendly_name,
        "bluetooth_mac_address": info.bluetooth_mac_address,
        "bluetooth_proxy_feature_flags": info.bluetooth_proxy_feature_flags,
        "api_encryption_supported": info.api_encryption_supported,
        "project_name": info.project_name, "project_version": info.project_version,
    })
    got, states = [], []
    done = asyncio.Event()
    mode_seen = asyncio.Event()
    mode_wanted = [0]

    def on_state(s):
        states.append([int(s.state), int(s.mode), int(s.configured_mode)])
        if int(s.state) == 2 and int(s.mode) == mode_wanted[0] and not mode_seen.is_set():
            # What arrives after this message was heard in the new mode: collected from here,
            # in the same callback (the batch may follow in the same read).
            got.clear()
            done.clear()
            mode_seen.set()

    def on_raw(resp):
        for a in resp.advertisements:
            got.append({"address": a.address, "rssi": a.rssi, "address_type": a.address_type, "data": a.data.hex()})
        if len(got) >= want:
            done.set()

    client.subscribe_bluetooth_scanner_state(on_state)
    client.subscribe_bluetooth_le_raw_advertisements(on_raw)
    say(subscribed=True)
    try:
        await asyncio.wait_for(done.wait(), 15)
    except TimeoutError:
        pass
    await asyncio.sleep(0.2)  # a scanner state sent with the subscription
    say(advertisements=got, scanner=states)
    if active:
        for mode, name in ((BluetoothScannerMode.ACTIVE, "active"), (BluetoothScannerMode.PASSIVE, "passive_again")):
            mode_wanted[0] = int(mode)
            mode_seen.clear()
            say(asking=name)
            client.bluetooth_scanner_set_mode(mode)
            try:
                await asyncio.wait_for(mode_seen.wait(), 5)
            except TimeoutError:
                say(**{name: None, "scanner": states})
                break
            try:
                await asyncio.wait_for(done.wait(), 15)
            except TimeoutError:
                pass
            say(**{name: list(got), "scanner": states})
    await client.disconnect()
    say(disconnected=True)


asyncio.run(main())
