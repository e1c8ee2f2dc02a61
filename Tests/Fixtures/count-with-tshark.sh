#!/bin/sh
# Re-counts the fixtures in this directory with tshark and prints the same
# rows as expected-counts.tsv / expected-ll-counts.tsv / expected-details.tsv,
# so a test (or a person) can compare them. See SOURCES.md for what each
# column means. Needs tshark (Debian: apt-get install -y tshark).
#
# usage: sh Tests/Fixtures/count-with-tshark.sh [hci|ll|details]   (default: hci)
set -eu
cd "$(dirname "$0")"
what=${1:-hci}
ver=$(tshark --version 2>/dev/null | head -n 1 | sed 's/^TShark (Wireshark) \([^ ]*\).*/\1/')

records() { tshark -r "$1" -T fields -e frame.number 2>/dev/null | wc -l | tr -d ' '; }
# Sum of Num_Reports over LE Meta events with the given subevent
# (0x02 LE Advertising Report, 0x0d LE Extended Advertising Report).
reports() {
	tshark -r "$1" -Y "bthci_evt.le_meta_subevent == $2" -T fields \
		-e bthci_evt.le_num_reports 2>/dev/null | awk '{ s += $1 } END { print s + 0 }'
}
count() { tshark -r "$1" -Y "$2" 2>/dev/null | wc -l | tr -d ' '; }

HCI_FILES="android-btsnoop-extcap-pixel6pro.log android-blue-heron-govee.cfa android-horizon-treadmill.log btmon-batteread-rpi5.btsnoop"
LL_FILES="ubertooth-crackle-le-secure-connections.pcapng nrf-sniffer-opendroneid-bt5-coded.pcapng"
ADV="(bthci_evt.le_meta_subevent == 0x02 || bthci_evt.le_meta_subevent == 0x0d)"

case $what in
hci)
	for f in $HCI_FILES; do
		printf '%s\t%s\t%s\t%s\t%s\n' "$f" "$(records "$f")" \
			"$(reports "$f" 0x02)" "$(reports "$f" 0x0d)" "$ver"
	done ;;
ll)
	for f in $LL_FILES; do
		printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$f" "$(records "$f")" \
			"$(count "$f" 'btle.advertising_header')" \
			"$(count "$f" 'btle.advertising_header && btle.advertising_header.pdu_type != 0x07')" \
			"$(count "$f" 'btle.advertising_header.pdu_type == 0x07')" \
			"$(count "$f" 'btle.crc.incorrect')" "$ver"
	done ;;
details)
	for f in $HCI_FILES; do
		addrs=$(tshark -r "$f" -Y "$ADV" -T fields -e bthci_evt.bd_addr 2>/dev/null | sort -u | grep -c . || true)
		maxr=$(tshark -r "$f" -Y "$ADV" -T fields -e bthci_evt.le_num_reports 2>/dev/null | sort -n | tail -n 1)
		printf '%s\t%s\t%s\t%s\t%s\n' "$f" "$(count "$f" "$ADV")" \
			"$(count "$f" "$ADV && btcommon.eir_ad.entry.company_id == 0x004c")" \
			"$addrs" "${maxr:-0}"
	done ;;
*) echo "usage: $0 [hci|ll|details]" >&2; exit 2 ;;
esac
