#!/bin/sh
# /init of bootplane's discovery initramfs (packed by scripts/make-discovery-image.sh):
# busybox sh as PID 1. Mounts proc/sys/dev, loads the NIC and disk modules in dependency
# order, brings every physical NIC up with a short DHCP on each, then hands over to the
# agent, which posts the inventory to bootplane.inventory= (a discovery boot) or wipes every
# disk and posts what it did to bootplane.wipe= (a cleanup boot), and powers the machine off,
# or installs an image and reboots (bootplane.install=, an install boot).
# If the agent fails (refused, or bootplane unreachable until its deadline) PID 1 exits
# and the kernel panics; with panic=-1 on the cmdline the machine reboots at once.
/bin/busybox mkdir -p /usr/share/udhcpc
/bin/busybox --install -s
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
echo "bootplane discovery: $(uname -r), loading modules"
while read -r m; do
  insmod "/lib/modules/$m" 2>/dev/null || true
done </etc/modules.order

# Let devices settle: until the NIC and disk lists stay the same for a second (max 10 s).
last="" i=0
while [ $i -lt 10 ]; do
  now="$(ls /sys/class/net /sys/block | tr '\n' ' ')"
  [ "$now" = "$last" ] && break
  last=$now i=$((i + 1))
  sleep 1
done

cat >/usr/share/udhcpc/default.script <<'EOF'
#!/bin/sh
case "$1" in
  bound|renew)
    ip addr add "$ip/${mask:-24}" dev "$interface" 2>/dev/null
    for r in $router; do ip route add default via "$r" dev "$interface" 2>/dev/null; break; done
    ;;
esac
exit 0
EOF
chmod +x /usr/share/udhcpc/default.script

for d in /sys/class/net/*; do
  n=${d##*/}
  [ -e "$d/device" ] || continue
  ip link set "$n" up
  echo "bootplane discovery: dhcp on $n ($(cat "$d/address"))"
  udhcpc -i "$n" -s /usr/share/udhcpc/default.script -n -q -t 5 -T 2 2>&1 | sed "s/^/bootplane discovery: $n: /" &
done
wait
ip -brief addr 2>/dev/null || ip addr

# A cleanup boot (bootplane.wipe= on the command line, docs/wipe.md) wipes every disk by
# bootplane.wipe_policy= and reports; any boot neither a cleanup nor an install is a
# discovery boot.
if grep -q 'bootplane\.wipe=' /proc/cmdline; then
  exec /bin/bootplane probe wipe --poweroff
fi
# An install boot (bootplane.install=, docs/install.md) streams the claim's disk image
# onto the disk the root-device hints choose, writes its Ignition, reports, and reboots
# into the installed system.
if grep -q 'bootplane\.install=' /proc/cmdline; then
  exec /bin/bootplane probe install --reboot
fi
exec /bin/bootplane probe --poweroff
