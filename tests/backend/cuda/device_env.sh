# Sourced on the GPU machine (tests/backend/cuda/device_run.sh, bench/ab.sh): where the image lacks
# some of the project's -dev packages, unpacks the carried Debian 12 .debs of DEBS_DIR (the list is
# in device_run.sh) into /tmp/deps and puts it first on every search path.
#   source tests/backend/cuda/device_env.sh DEBS_DIR
dsv4_debs=${1:-}
dsv4_have_all=1
for h in /usr/include/nlohmann /usr/include/fmt /usr/include/gtest /usr/include/CLI /usr/include/pcre2.h \
         /usr/include/httplib.h; do
  [ -e "$h" ] || dsv4_have_all=0
done
command -v pkg-config >/dev/null || dsv4_have_all=0
if [ "$dsv4_have_all" = 0 ] && [ -n "$dsv4_debs" ] && [ -d "$dsv4_debs" ]; then
  echo "using the carried packages in $dsv4_debs"
  if [ ! -d /tmp/deps/usr ]; then
    mkdir -p /tmp/deps
    for f in "$dsv4_debs"/*.deb; do dpkg -x "$f" /tmp/deps; done
    sed -i 's|^prefix=/usr$|prefix=/tmp/deps/usr|' /tmp/deps/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc \
      /tmp/deps/usr/share/pkgconfig/*.pc
  fi
  export CMAKE_PREFIX_PATH=/tmp/deps/usr
  export LD_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export PKG_CONFIG_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu/pkgconfig:/tmp/deps/usr/share/pkgconfig
  command -v pkg-config >/dev/null || export PATH=$PATH:/tmp/deps/usr/bin
fi
export PATH=$PATH:/usr/local/cuda/bin
