"""Home Assistant's side of an active connection, for Tests/BatonProxyTests/GATTProxyTests.swift.

aioesphomeapi (pinned in scripts/esphome-venv) does what bleak-esphome does for an integration
that connects through a proxy (docs/esphome.md §11): hears the connection slots, connects
without a cache, lists the services, reads, writes with and without response, turns a
characteristic's notifications on (the notify request, then the CCCD write a client does itself
on a proxy with remote caching), waits for a notification, and disconnects. One JSON line per
step on stdout; the Swift test reads them after the process exits.

    gatt_client.py PORT ADDRESS [KEY|- [ADDRESS_TYPE]]   (address type 1, random, by default)
"""
import asyncio
import json
import sys

from aioesphomeapi import APIClient


def say(**kw):
    print(json.dumps(kw), flush=True)


async def main() -> None:
    port, address = int(sys.argv[1]), int(sys.argv[2])
    key = sys.argv[3] if len(sys.argv) > 3 and sys.argv[3] != "-" else None
    address_type = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    client = APIClient("127.0.0.1", port, None, noise_psk=key, client_info="baton-gatt-test", keepalive=60)
    try:
        await asyncio.wait_for(client.connect(login=False), 15)
        info = await client.device_info()
        flags = info.bluetooth_proxy_feature_flags
        say(feature_flags=flags)
        slots = []
        client.subscribe_bluetooth_connections_free(lambda free, limit, allocated: slots.append([free, limit, list(allocated)]))
        await asyncio.sleep(0.2)
        states = []
        connected = asyncio.Event()

        def on_state(is_connected, mtu, error):
            states.append([bool(is_connected), mtu, error])
            if is_connected:
                connected.set()

        await client.bluetooth_device_connect(address, on_state, timeout=10, feature_flags=flags, has_cache=False,
                                              address_type=address_type)
        await asyncio.wait_for(connected.wait(), 10)
        say(connected=states)
        services = await client.bluetooth_gatt_get_services(address)
        say(services=[{"uuid": s.uuid, "handle": s.handle, "characteristics": [
            {"uuid": c.uuid, "handle": c.handle, "properties": c.properties,
             "descriptors": [[d.uuid, d.handle] for d in c.descriptors]} for c in s.characteristics]}
            for s in services.services])
        say(battery=(await client.bluetooth_gatt_read(address, 3)).hex())
        say(long=(await client.bluetooth_gatt_read(address, 7)).hex())
        await client.bluetooth_gatt_write(address, 7, b"\x01\x02\x03", True)
        await client.bluetooth_gatt_write(address, 7, b"\x04", False)
        say(written=(await client.bluetooth_gatt_read(address, 7)).hex())
        try:
            await client.bluetooth_gatt_read(address, 0x42)
        except Exception as e:  # noqa: BLE001 - the test reads the class and the text
            say(read_error=type(e).__name__, message=str(e))
        notified = asyncio.Queue()
        await client.bluetooth_gatt_start_notify(address, 9, lambda handle, data: notified.put_nowait(bytes(data).hex()))
        await client.bluetooth_gatt_write_descriptor(address, 10, b"\x01\x00")
        say(notification=await asyncio.wait_for(notified.get(), 10))
        await client.bluetooth_device_disconnect(address)
        await asyncio.sleep(0.2)
        say(states=states, slots=slots)
    except Exception as e:  # noqa: BLE001 - the test asserts on the class name
        say(error=type(e).__name__, message=str(e))
    await client.disconnect()
    say(disconnected=True)


asyncio.run(main())
